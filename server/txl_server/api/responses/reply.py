"""One response as its turn runs: the text so far, the finished response object (answered and stored), and
OpenAI's sequence of stream events, as payloads (numbered and written out by `NumberedEvents`)."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from txl.tokenizers import Tokenizer

from ...sessions.events import TokenEvent
from ...sessions.responses import ResponseRecord, ResponseTurns, Turn, TurnStarted
from ...sessions.service import GenerateOutcome
from ...sessions.step import to_the_end
from ...telemetry.spans import annotate_request, usage
from ..shared import sse
from ..shared.chat_template import ChatMessage
from ..shared.openai_errors import openai_body
from .protocol import (
    ConversationRef,
    IncompleteDetails,
    OutputMessage,
    OutputText,
    ResponseCreateRequest,
    ResponseError,
    ResponseObject,
    ResponseStatus,
    ResponseUsage,
    TokenLogprob,
    TopTokenLogprob,
    item_id,
)
from .turn_input import input_items

Payload = dict[str, Any]
UNLIKELY = -9999.0  # OpenAI's log-prob of a token too unlikely to say (-inf is not JSON)


def token_logprob(tokenizer: Tokenizer, event: TokenEvent) -> TokenLogprob:
    """A generated token's log-prob and its likeliest alternatives, as Open Responses lists them."""

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {
            "token": token,
            "logprob": max(logprob, UNLIKELY),
            "bytes": list(token.encode("utf-8", "replace")),
        }

    top = [TopTokenLogprob(**entry(tokenizer.decode([i]), lp)) for i, lp in event.top or ()]
    return TokenLogprob(**entry(event.text, event.logprob), top_logprobs=top)


@dataclass(frozen=True, kw_only=True)
class ReplyTo:
    """What a response replies to, fixed once its turn is made, in the foreground or the background: the request,
    its turn, the messages its input was written as (with a chat template), the served model, the turns' service
    and the tenant; in a conversation, what is done once the reply is saved (its items appended)."""

    body: ResponseCreateRequest
    turn: Turn
    messages: list[ChatMessage] | None
    model: str
    turns: ResponseTurns
    tenant: str
    on_finish: Callable[[Reply], Awaitable[None]] | None = None


class Reply:
    """One response as its turn runs: the text so far, then the finished object, which `save` stores."""

    def __init__(self, to: ReplyTo, started: TurnStarted) -> None:
        self.body, self.turn, self.started, self.messages = to.body, to.turn, started, to.messages
        self.model, self.turns, self.tenant = to.model, to.turns, to.tenant
        self.conversation = to.body.conversation_id
        self.previous_response_id = to.body.previous_response_id
        self.id, self.message_id = started.response_id, item_id()
        self.created_at = int(time.time())
        self.text = ""
        self.logprobs: list[TokenLogprob] = []
        self.outcome: GenerateOutcome | None = None
        self.error: ResponseError | None = None
        self.cancelled = False
        self.queued = False
        self.saved = False
        self.on_finish = to.on_finish  # once the response is saved
        self._final: ResponseObject | None = None
        # The object its record holds, when the turn's commit stored it (`committed`): the one answered.
        self._committed: ResponseObject | None = None

    def take(self, item: Any) -> tuple[str, list[TokenLogprob]]:
        """Takes a turn's event; returns the text it adds to the reply (a chat reply's leading whitespace is
        dropped, as chat completions drop it) and its tokens' log-probs (with `include`)."""
        if isinstance(item, GenerateOutcome):
            self.outcome = item
            if self._committed is not None:
                self._final = self._committed
            started = self.started  # the trace's usage as the response's: cached context counted in
            annotate_request(usage(started.fed_tokens, started.cached_tokens, item.result.completion_tokens))
            return "", []
        if not isinstance(item, TokenEvent):
            return "", []
        piece = item.text.lstrip() if self.messages is not None and not self.text else item.text
        self.text += piece
        logprobs = [token_logprob(self.turns.service.tokenizer, item)] if self.body.logprobs else []
        self.logprobs += logprobs
        return piece, logprobs

    def fail(self, status: int, error: dict[str, Any]) -> None:
        """The turn ended in `error` (the server's shape): the response is `failed`, with OpenAI's code."""
        detail = openai_body(status, error)["error"]
        self.error = ResponseError(code=str(detail["code"] or detail["type"]), message=str(detail["message"]))

    @property
    def status(self) -> ResponseStatus:
        if self.outcome is not None:
            return "completed" if self.outcome.result.finish_reason == "stop" else "incomplete"
        if self.error is not None:
            return "failed"
        if self.cancelled:
            return "cancelled"
        return "queued" if self.queued else "in_progress"

    def message(self, *, added: bool = False) -> OutputMessage:
        status = self.status if self.status in ("completed", "incomplete") else "in_progress"
        parts = [] if added else [OutputText(text=self.text, logprobs=self.logprobs)]
        return OutputMessage(id=self.message_id, status=status, content=parts)

    def object(self) -> ResponseObject:
        """The response as it stands; once finished, always the same object (as answered and stored)."""
        if self._final is not None:
            return self._final
        body, status, usage = self.body, self.status, None
        if self.outcome is not None:
            usage = ResponseUsage.of(
                fed=self.started.fed_tokens,
                cached=self.started.cached_tokens,
                output=self.outcome.result.completion_tokens,
                stored=self.turn.store,
            )
        response = ResponseObject(
            id=self.id,
            created_at=self.created_at,
            completed_at=int(time.time()) if self.outcome is not None else None,
            status=status,
            error=self.error,
            incomplete_details=IncompleteDetails(reason="max_output_tokens")
            if status == "incomplete"
            else None,
            instructions=body.instructions,
            max_output_tokens=self.turn.max_tokens,
            metadata=body.metadata or {},
            model=self.model,
            output=[self.message()] if self.outcome is not None else [],
            previous_response_id=self.previous_response_id,
            store=body.store is not False,
            temperature=self.turn.sampling.temperature,
            top_p=self.turn.sampling.top_p,
            truncation=body.truncation or "auto",
            background=bool(body.background),
            conversation=ConversationRef(id=self.conversation) if self.conversation else None,
            usage=usage,
            user=body.user,
            top_logprobs=body.top_logprobs or 0,
            service_tier=self.turn.klass.tier.value if self.turn.klass is not None else "default",
        )
        if status not in ("queued", "in_progress"):
            self._final = response
        return response

    @property
    def turn_end(self) -> bool:
        """Whether the reply ended at the template's turn end (the user's prefix is in memory already)."""
        assert self.outcome is not None
        result = self.outcome.result
        stop = self.turn.stop[0] if self.turn.stop else None
        return (
            stop is not None
            and result.finish_reason == "stop"
            and self.turns.service.tokenizer.decode(result.token_ids).endswith(stop)
        )

    def record(self, before: int = 0) -> ResponseRecord:
        """The finished response as it is stored: to retrieve it, list its input items and continue it
        (`before`: messages of the turn written before its input's, which are not its input items)."""
        return ResponseRecord(
            self.id,
            self.tenant,
            self.object().model_dump(),
            input_items(self.body, self.messages, before),
            self.messages is not None,
            self.turn_end,
        )

    def committed(self, outcome: GenerateOutcome) -> ResponseRecord:
        """The response's record as its turn commits with `outcome`, for that commit to store (Redis writes both
        or neither). Nothing of the reply changes until the outcome arrives (`take`): a commit that fails leaves
        it unfinished; one that succeeds makes this record's object the one answered."""
        self.outcome = outcome
        try:
            record = self.record()
            self._committed = self._final
        finally:
            self.outcome, self._final = None, None
        return record

    async def save(self) -> None:
        """Stores the finished response (with `store`), so that it can be retrieved and continued; runs to its
        end once begun (the turn committed: what it leaves must say so). A record its commit stored is not
        written again."""
        if not self.saved:
            await to_the_end(self._save())

    async def _save(self) -> None:
        if self.body.store is not False and self._committed is None:
            await self.turns.save(self.record())
        if self.on_finish is not None:
            await self.on_finish(self)
        self.saved = True


class ClosingStream:
    """A stream's lines that, closed, also close the turn's events: a stream closed before its first line (its
    client left at once) must still end the turn the route began."""

    def __init__(
        self,
        lines: AsyncGenerator[str, None],
        events: AsyncGenerator[Any, None],
        held: contextlib.AsyncExitStack | None = None,
    ) -> None:
        self.lines, self.events, self.held = lines, events, held

    def __aiter__(self) -> ClosingStream:
        return self

    async def __anext__(self) -> str:
        return await anext(self.lines)

    async def aclose(self) -> None:
        try:
            await self.lines.aclose()
            await self.events.aclose()
        finally:
            if self.held is not None:
                await self.held.aclose()  # what the turn held (its conversation) is let go


def written(payload: Payload) -> str:
    """One event as Open Responses streams it: `event` naming its type, then its data."""
    return f"event: {payload['type']}\n" + sse.event(payload)


class NumberedEvents:
    """A Responses stream's events, each numbered from 0 (`sequence_number`) as it is sent."""

    def __init__(self, reply: Reply | None = None) -> None:
        self.reply = reply
        self.numbers = itertools.count()

    def number(self, payload: Payload) -> Payload:
        return {"type": payload["type"], "sequence_number": next(self.numbers), **payload}

    def event(self, payload: Payload) -> str:
        return written(self.number(payload))

    def failure(self, status: int, error: dict[str, Any]) -> list[Payload]:
        """What ends a stream cut short by `error`: an `error` event (OpenAI's fields, and Open Responses'
        `error` object), then `response.failed`."""
        detail = openai_body(status, error)["error"]
        payloads = [self.number({**detail, "type": "error", "error": detail})]
        if self.reply is not None:
            self.reply.fail(status, error)
            payloads.append(
                self.number({"type": "response.failed", "response": self.reply.object().model_dump()})
            )
        return payloads

    def ending(self, status: int, error: dict[str, Any]) -> str:
        """The end of a stream cut short (`StreamEnding`): its failure's events, then `[DONE]`."""
        return "".join(written(p) for p in self.failure(status, error)) + sse.DONE


async def response_events(
    reply: Reply, events: AsyncGenerator[Any, None]
) -> AsyncGenerator[list[Payload], None]:
    """OpenAI's event sequence, in the groups that are ready together (each group is one write to the client, or
    to a background job's record): created, in_progress, the output item and its text part added; each text
    delta; then each done, and completed (or incomplete, at max_output_tokens). The response is saved before its
    last events, so that a client that read them can retrieve and continue it."""
    where = {"item_id": reply.message_id, "output_index": 0, "content_index": 0}
    try:
        yield [
            {"type": "response.created", "response": reply.object().model_dump()},
            {"type": "response.in_progress", "response": reply.object().model_dump()},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": reply.message(added=True).model_dump(),
            },
            {"type": "response.content_part.added", **where, "part": OutputText(text="").model_dump()},
        ]
        async for item in events:
            delta, logprobs = reply.take(item)
            if delta or logprobs:
                lp = [x.model_dump() for x in logprobs]
                yield [{"type": "response.output_text.delta", **where, "delta": delta, "logprobs": lp}]
        await reply.save()
        lp = [x.model_dump() for x in reply.logprobs]
        part = OutputText(text=reply.text, logprobs=reply.logprobs).model_dump()
        final = "response.completed" if reply.status == "completed" else "response.incomplete"
        yield [
            {"type": "response.output_text.done", **where, "text": reply.text, "logprobs": lp},
            {"type": "response.content_part.done", **where, "part": part},
            {"type": "response.output_item.done", "output_index": 0, "item": reply.message().model_dump()},
            {"type": final, "response": reply.object().model_dump()},
        ]
    finally:
        await events.aclose()


async def stream_events(
    reply: Reply, events: AsyncGenerator[Any, None], numbered: NumberedEvents
) -> AsyncGenerator[str, None]:
    """The event sequence written out and numbered, a group at a time, then `[DONE]` (with the last group). An
    error after the stream began ends it with `error` and `response.failed` (`NumberedEvents.ending`, sent by the
    EventStream)."""
    groups = response_events(reply, events)
    try:
        async for group in groups:
            text = "".join(numbered.event(payload) for payload in group)
            yield text + sse.DONE if group[-1]["type"] in FINAL_EVENTS else text
    finally:
        await groups.aclose()


FINAL_EVENTS = ("response.completed", "response.incomplete")
