"""The Responses API on top of session history (sessions/responses.py): a response is a turn of a session, named
by the session and its version after the turn, so a turn chained with `previous_response_id` feeds only its new
input; chained to an older response, it branches."""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse

from ...errors import InvalidRequest, NotFound
from ...metrics import Metrics
from ...sessions.events import TokenEvent
from ...sessions.responses import ResponseTurns, Turn, TurnStarted
from ...sessions.store.responses import ResponseRecord, ResponseStore
from ...settings import Settings
from ..shared.chat_template import ChatTemplate
from ..shared.dependencies import AppSettings, Service
from ..shared.event_stream import EventStream
from ..shared.limits import check_metadata, check_text, check_unicode, max_tokens_of
from ..shared.openai_errors import ModelNotFound
from ..shared.text_log import log_text
from ..shared.timing import TokenTiming, timed
from .protocol import DEFAULT_MAX_OUTPUT_TOKENS, InputItemList, InputMessageItem, ResponseCreateRequest
from .reply import ClosingStream, NumberedEvents, Reply, stream_events
from .turn_input import turn_text


def get_turns(request: Request, service: Service, settings: AppSettings) -> ResponseTurns:
    """One ResponseTurns per running service (a restarted runtime gets a new one)."""
    turns: ResponseTurns | None = getattr(request.app.state, "response_turns", None)
    if turns is None or turns.service is not service:
        store = ResponseStore(service.store, keep_versions=settings.keep_versions)
        turns = request.app.state.response_turns = ResponseTurns(service, store)
    return turns


async def create_response(
    body: ResponseCreateRequest,
    turns: ResponseTurns,
    tenant: str,
    settings: Settings,
    model_id: str,
    metrics: Metrics,
) -> Any:
    """The response's JSON, or its stream of events (with `stream`)."""
    max_tokens = _checked(body, settings, model_id)
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
        max_tokens,
        body.to_sampling_params(),
        [stop] if stop else [],
        body.store is not False,
    )
    events = timed(turns.run(tenant, previous, turn), TokenTiming(metrics), _token_choice)
    started = await anext(events)  # errors before the turn holds its session are HTTP errors
    assert isinstance(started, TurnStarted)
    reply = Reply(body, turn, started, messages, model_id, turns, tenant)
    if body.stream:
        numbered = NumberedEvents()
        lines = ClosingStream(stream_events(reply, events, numbered), events)
        return EventStream(lines, ending=numbered.ending)
    async with contextlib.aclosing(events):
        async for item in events:
            reply.take(item)
    await reply.save()
    return JSONResponse(reply.object().model_dump())


def _token_choice(item: Any) -> int | None:
    return 0 if isinstance(item, TokenEvent) else None


def _checked(body: ResponseCreateRequest, settings: Settings, model_id: str) -> int:
    """Checks the request's limits; its max_output_tokens."""
    if body.model is not None and body.model != model_id:
        raise ModelNotFound(body.model, model_id)
    body.refuse_unsupported()
    check_metadata(settings, body.metadata)
    check_unicode(body.user or "", "user")
    check_text(settings, body.instructions or "", "instructions")
    if isinstance(body.input, str):
        check_text(settings, body.input, "input")
    return max_tokens_of(settings, body.max_output_tokens, DEFAULT_MAX_OUTPUT_TOKENS, "max_output_tokens")


async def find(turns: ResponseTurns, tenant: str, response_id: str) -> ResponseRecord:
    """A stored response of the tenant's, or 404."""
    record = await turns.store.find(tenant, response_id)
    if record is None:
        raise NotFound(f"no response {response_id[:100]!r}", param="response_id")
    return record


def list_input_items(
    record: ResponseRecord, after: str | None, limit: int, order: Literal["asc", "desc"]
) -> InputItemList:
    """A page of the input items of the response's own turn."""
    items = [InputMessageItem.model_validate(i) for i in record.input_items]
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
