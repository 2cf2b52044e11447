"""One response as its turn runs: the text so far, the finished response object (answered and stored), and
OpenAI's sequence of stream events."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncGenerator
from typing import Any, Literal

from ...sessions.events import TokenEvent
from ...sessions.responses import ResponseTurns, Turn, TurnStarted
from ...sessions.service import GenerateOutcome
from ...sessions.store.responses import ResponseRecord
from ..shared import sse
from ..shared.chat_template import ChatMessage
from ..shared.openai_errors import openai_body
from .protocol import (
    IncompleteDetails,
    OutputMessage,
    OutputText,
    ResponseCreateRequest,
    ResponseObject,
    ResponseUsage,
    item_id,
)
from .turn_input import input_items


class Reply:
    """One response as its turn runs: the text so far, then the finished object, which `save` stores."""

    def __init__(
        self,
        body: ResponseCreateRequest,
        turn: Turn,
        started: TurnStarted,
        messages: list[ChatMessage] | None,
        model: str,
        turns: ResponseTurns,
        tenant: str,
    ) -> None:
        self.body, self.turn, self.started, self.messages = body, turn, started, messages
        self.model, self.turns, self.tenant = model, turns, tenant
        self.id, self.message_id = started.response_id, item_id()
        self.created_at = int(time.time())
        self.text = ""
        self.outcome: GenerateOutcome | None = None
        self._final: ResponseObject | None = None

    def take(self, item: Any) -> str:
        """Takes a turn's event; returns the text it adds to the reply (a chat reply's leading whitespace is
        dropped, as chat completions drop it)."""
        if isinstance(item, GenerateOutcome):
            self.outcome = item
            return ""
        if not isinstance(item, TokenEvent):
            return ""
        piece = item.text.lstrip() if self.messages is not None and not self.text else item.text
        self.text += piece
        return piece

    @property
    def status(self) -> Literal["in_progress", "completed", "incomplete"]:
        if self.outcome is None:
            return "in_progress"
        return "completed" if self.outcome.result.finish_reason == "stop" else "incomplete"

    def message(self) -> OutputMessage:
        return OutputMessage(id=self.message_id, status=self.status, content=[OutputText(text=self.text)])

    def object(self) -> ResponseObject:
        """The response as it stands; once finished, always the same object (as answered and stored)."""
        if self._final is not None:
            return self._final
        body, status, usage = self.body, self.status, None
        if self.outcome is not None:
            usage = ResponseUsage.of(
                fed=len(self.turn.tokens),
                cached=self.started.cached_tokens,
                output=self.outcome.result.completion_tokens,
                stored=self.turn.store,
            )
        response = ResponseObject(
            id=self.id,
            created_at=self.created_at,
            completed_at=int(time.time()) if self.outcome is not None else None,
            status=status,
            incomplete_details=IncompleteDetails(reason="max_output_tokens")
            if status == "incomplete"
            else None,
            instructions=body.instructions,
            max_output_tokens=self.turn.max_tokens,
            metadata=body.metadata or {},
            model=self.model,
            output=[self.message()] if self.outcome is not None else [],
            previous_response_id=body.previous_response_id,
            store=self.turn.store,
            temperature=self.turn.sampling.temperature,
            top_p=self.turn.sampling.top_p,
            truncation=body.truncation or "disabled",
            usage=usage,
            user=body.user,
        )
        if self.outcome is not None:
            self._final = response
        return response

    async def save(self) -> None:
        """Stores the finished response (with `store`), so that it can be retrieved and continued."""
        assert self.outcome is not None
        if not self.turn.store:
            return
        result = self.outcome.result
        stop = self.turn.stop[0] if self.turn.stop else None
        turn_end = (
            stop is not None
            and result.finish_reason == "stop"
            and self.turns.service.tokenizer.decode(result.token_ids).endswith(stop)
        )
        record = ResponseRecord(
            self.id,
            self.tenant,
            self.object().model_dump(),
            input_items(self.body, self.messages),
            self.messages is not None,
            turn_end,
        )
        await self.turns.store.save(record)


class ClosingStream:
    """A stream's lines that, closed, also close the turn's events: a stream closed before its first line (its
    client left at once) must still end the turn the route began."""

    def __init__(self, lines: AsyncGenerator[str, None], events: AsyncGenerator[Any, None]) -> None:
        self.lines, self.events = lines, events

    def __aiter__(self) -> ClosingStream:
        return self

    async def __anext__(self) -> str:
        return await anext(self.lines)

    async def aclose(self) -> None:
        await self.lines.aclose()
        await self.events.aclose()


class NumberedEvents:
    """A Responses stream's events, each named (`event: TYPE`) and numbered from 0 (`sequence_number`)."""

    def __init__(self) -> None:
        self.numbers = itertools.count()

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": next(self.numbers), **fields}
        return f"event: {kind}\n" + sse.event(payload)

    def ending(self, status: int, error: dict[str, Any]) -> str:
        """The `error` event that ends a stream cut short (`StreamEnding`): OpenAI's code, message and param."""
        detail = openai_body(status, error)["error"]
        return self.event("error", code=detail["code"], message=detail["message"], param=detail["param"])


async def stream_events(
    reply: Reply, events: AsyncGenerator[Any, None], numbered: NumberedEvents
) -> AsyncGenerator[str, None]:
    """OpenAI's event sequence, each event numbered: created, in_progress, the output item and its text part
    added, text deltas, then each done, then completed (or incomplete, at max_output_tokens). An error after the
    stream began ends it with an `error` event (`NumberedEvents.ending`, sent by the EventStream)."""
    event = numbered.event
    where = {"item_id": reply.message_id, "output_index": 0, "content_index": 0}
    try:
        yield event("response.created", response=reply.object().model_dump())
        yield event("response.in_progress", response=reply.object().model_dump())
        yield event("response.output_item.added", output_index=0, item=reply.message().model_dump())
        yield event("response.content_part.added", **where, part=OutputText(text="").model_dump())
        async for item in events:
            delta = reply.take(item)
            if delta:
                yield event("response.output_text.delta", **where, delta=delta, logprobs=[])
        await reply.save()
        yield event("response.output_text.done", **where, text=reply.text, logprobs=[])
        yield event("response.content_part.done", **where, part=OutputText(text=reply.text).model_dump())
        yield event("response.output_item.done", output_index=0, item=reply.message().model_dump())
        final = "response.completed" if reply.status == "completed" else "response.incomplete"
        yield event(final, response=reply.object().model_dump())
    finally:
        await events.aclose()
