"""OpenAI's Responses API: `POST /v1/responses` (streamed or not), `GET` and `DELETE /v1/responses/{id}`, and
`GET /v1/responses/{id}/input_items`, on top of session history (sessions/responses.py).

A response names a session and its version after the turn, so a turn chained with `previous_response_id` feeds
only its new input; chained to an older response, it branches. The official `openai` client's
`client.responses` works unchanged: `output_text`, `stream=True`, `retrieve`, `delete`, `input_items.list`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from ..errors import InvalidRequest, NotFound, ServiceError
from ..sessions.events import TokenEvent
from ..sessions.responses import ResponseTurns, Turn, TurnStarted
from ..sessions.service import GenerateOutcome
from ..sessions.store.responses import ResponseRecord, ResponseStore
from ..settings import Settings
from . import sse
from .chat import ChatMessage, ChatTemplate
from .common import (
    ERROR_RESPONSES,
    AppSettings,
    EventStream,
    MetricsDep,
    ModelId,
    Service,
    Tenant,
    TokenTiming,
    check_metadata,
    check_text,
    check_unicode,
    log_text,
)
from .disconnect import WatchedRoute, watch_connection
from .responses_protocol import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    DeletedResponse,
    IncompleteDetails,
    InputItemList,
    InputMessageItem,
    OutputMessage,
    OutputText,
    ResponseCreateRequest,
    ResponseObject,
    ResponsesErrorBody,
    ResponseUsage,
    input_items,
    item_id,
    turn_text,
)

log = logging.getLogger(__name__)
# OpenAI's own error for a previous response that cannot be continued: type invalid_request_error (a 400).
_ERRORS = {**ERROR_RESPONSES, 400: {"model": ResponsesErrorBody, "description": "a value the server refuses"}}
router = APIRouter(tags=["responses"], responses=_ERRORS, route_class=WatchedRoute)


def get_turns(request: Request, service: Service, settings: AppSettings) -> ResponseTurns:
    """One ResponseTurns per running service (a restarted runtime gets a new one)."""
    turns: ResponseTurns | None = getattr(request.app.state, "response_turns", None)
    if turns is None or turns.service is not service:
        store = ResponseStore(service.store, keep_versions=settings.keep_versions)
        turns = request.app.state.response_turns = ResponseTurns(service, store)
    return turns


Turns = Annotated[ResponseTurns, Depends(get_turns)]


@router.post(
    "/v1/responses",
    response_model=ResponseObject,
    responses={200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE events with stream"}},
)
@watch_connection
async def create_response(
    body: ResponseCreateRequest,
    turns: Turns,
    tenant: Tenant,
    settings: AppSettings,
    model_id: ModelId,
    metrics: MetricsDep,
) -> Any:
    """A reply to `input`, continuing `previous_response_id`'s session from its version (only the new input is
    fed), or a new session."""
    plan = _plan(body, settings, model_id)
    previous = None
    if body.previous_response_id is not None:
        previous = await turns.previous(tenant, body.previous_response_id)
    template = ChatTemplate(settings.chat_template) if settings.chat_template is not None else None
    text, messages = turn_text(body, template, previous)
    check_text(settings, text, "input")
    log_text(settings, "responses input", text)
    stop = template.stop() if template is not None and messages is not None else None
    turn = Turn(
        text,
        turns.service.tokenizer.encode(text),
        plan,
        body.to_sampling_params(),
        [stop] if stop else [],
        body.store is not False,
    )
    events = _timed(turns.run(tenant, previous, turn), TokenTiming(metrics))
    started = await anext(events)  # errors before the turn holds its session are HTTP errors
    assert isinstance(started, TurnStarted)
    reply = Reply(body, turn, started, messages, model_id, turns, tenant)
    if body.stream:
        return EventStream(_Closing(_stream(reply, events), events))
    async with contextlib.aclosing(events):
        async for item in events:
            reply.take(item)
    await reply.save()
    return JSONResponse(reply.object().model_dump())


@router.get("/v1/responses/{response_id}", response_model=ResponseObject)
async def get_response(response_id: str, turns: Turns, tenant: Tenant) -> Any:
    """A stored response (while its session keeps its version)."""
    return JSONResponse((await _find(turns, tenant, response_id)).response)


@router.delete("/v1/responses/{response_id}", response_model=DeletedResponse)
async def delete_response(response_id: str, turns: Turns, tenant: Tenant) -> DeletedResponse:
    """Forgets a stored response: it can no longer be retrieved or continued (the session stays)."""
    record = await _find(turns, tenant, response_id)
    await turns.store.delete(record)
    return DeletedResponse(id=record.id)


@router.get("/v1/responses/{response_id}/input_items", response_model=InputItemList)
async def list_input_items(
    response_id: str,
    turns: Turns,
    tenant: Tenant,
    after: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> InputItemList:
    """The input items of the response's own turn (a string input is one user message)."""
    items = [
        InputMessageItem.model_validate(i) for i in (await _find(turns, tenant, response_id)).input_items
    ]
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item.id for item in items]
        if after not in ids:
            raise InvalidRequest(f"no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return InputItemList(
        data=page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=len(items) > limit,
    )


# ---------------------------------------------------------------------------------------------- requests


def _plan(body: ResponseCreateRequest, settings: Settings, model_id: str) -> int:
    """Checks the request's limits; its max_output_tokens."""
    if body.model is not None and body.model != model_id:
        raise InvalidRequest(
            f"unknown model {body.model[:100]!r}; this server serves {model_id!r}", param="model"
        )
    body.refuse_unsupported()
    check_metadata(settings, body.metadata)
    check_unicode(body.user or "", "user")
    check_text(settings, body.instructions or "", "instructions")
    if isinstance(body.input, str):
        check_text(settings, body.input, "input")
    max_tokens = DEFAULT_MAX_OUTPUT_TOKENS if body.max_output_tokens is None else body.max_output_tokens
    if max_tokens > settings.max_tokens:
        raise InvalidRequest(
            f"max_output_tokens must be at most {settings.max_tokens}", param="max_output_tokens"
        )
    return max_tokens


async def _find(turns: ResponseTurns, tenant: str, response_id: str) -> ResponseRecord:
    record = await turns.store.find(tenant, response_id)
    if record is None:
        raise NotFound(f"no response {response_id[:100]!r}", param="response_id")
    return record


async def _timed(source: AsyncGenerator[Any, None], timing: TokenTiming) -> AsyncGenerator[Any, None]:
    try:
        async for item in source:
            if isinstance(item, TokenEvent):
                timing.token()
            yield item
    finally:
        await source.aclose()


# ---------------------------------------------------------------------------------------------- the reply


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


class _Closing:
    """A stream's lines that, closed, also close the turn's events: a stream closed before its first line (its
    client left at once) must still end the turn the route began."""

    def __init__(self, lines: AsyncGenerator[str, None], events: AsyncGenerator[Any, None]) -> None:
        self.lines, self.events = lines, events

    def __aiter__(self) -> _Closing:
        return self

    async def __anext__(self) -> str:
        return await anext(self.lines)

    async def aclose(self) -> None:
        await self.lines.aclose()
        await self.events.aclose()


async def _stream(reply: Reply, events: AsyncGenerator[Any, None]) -> AsyncGenerator[str, None]:
    """OpenAI's event sequence, each event numbered: created, in_progress, the output item and its text part
    added, text deltas, then each done, then completed (or incomplete, at max_output_tokens). An error after the
    stream began is an `error` event, which ends it."""
    numbers = itertools.count()

    def event(kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": next(numbers), **fields}
        return f"event: {kind}\n" + sse.event(payload)

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
    except ServiceError as exc:
        yield event("error", code=exc.code or exc.type, message=exc.message, param=exc.param)
    except Exception:
        log.exception("a streamed response failed")
        yield event("error", code="internal", message="internal error", param=None)
    finally:
        await events.aclose()
