"""The Responses API on top of session history (sessions/responses.py): a response is a turn of a session, named
by the session and its version after the turn, so a turn chained with `previous_response_id` feeds only its new
input; chained to an older response, it branches. A turn in a conversation continues the conversation's session
(sessions/conversations.py); a background one runs on while its client polls (background.py)."""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from ...admission.classes import request_class
from ...errors import InvalidRequest, NotFound
from ...metrics import Metrics
from ...sessions.events import TokenEvent
from ...sessions.responses import ResponseRecord, ResponseTurns, Turn, TurnStarted
from ...sessions.responses_services import ResponsesServices
from ...settings import Settings
from ...telemetry.spans import turn_started
from ..shared.chat_template import ChatTemplate
from ..shared.event_stream import EventStream
from ..shared.json_response import JSONResponse
from ..shared.limits import check_metadata, check_stop, check_text, check_unicode, max_tokens_of
from ..shared.openai_errors import ModelNotFound
from ..shared.text_log import log_text
from ..shared.timing import TokenTiming, timed
from . import background
from .conversation_turns import ConversationTurns
from .paging import page_of
from .protocol import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    DeletedResponse,
    InputItemList,
    InputMessageItem,
    ResponseCreateRequest,
)
from .reply import ClosingStream, NumberedEvents, Reply, ReplyTo, stream_events
from .turn_input import turn_text


async def create_response(
    body: ResponseCreateRequest,
    responses: ResponsesServices,
    *,
    tenant: str,
    settings: Settings,
    model_id: str,
    metrics: Metrics,
) -> Any:
    """The response's JSON, or its stream of events (with `stream`); with `background`, the response as queued
    (or its stream, followed from the job)."""
    turns = responses.turns
    max_tokens = _checked(body, settings, model_id)
    template = ChatTemplate(settings.chat_template) if settings.chat_template is not None else None
    async with contextlib.AsyncExitStack() as stack:
        previous, place, conversation = None, None, None
        if body.conversation_id is not None:
            conversation = await ConversationTurns.hold(
                responses.conversations, tenant, body.conversation_id, stack
            )
            ending, before = conversation.ending, conversation.before
        else:
            if body.previous_response_id is not None:
                previous = await turns.previous(tenant, body.previous_response_id)
            ending, before = previous, []
        text, messages = turn_text(body, template, ending, before)
        check_text(settings, text, "input")
        log_text(settings, "responses input", text)
        stop = template.stop() if template is not None and messages is not None else None
        stops = ([stop] if stop else []) + check_stop(settings, body.stop)
        turn = Turn(
            text=text,
            tokens=turns.service.tokenizer.encode(text),
            max_tokens=max_tokens,
            sampling=body.to_sampling_params(),
            stop=stops,
            store=body.store is not False or conversation is not None,
            top_logprobs=body.top_logprobs or (1 if body.logprobs else 0),
            window=body.truncation == "disabled",
            # Background responses are batch work: they never delay an interactive first token.
            klass=request_class(tenant, body.service_tier, batch=bool(body.background)),
        )
        if turn.klass is not None:
            turn.klass.decode_rows, turn.klass.decode_tokens = 1, max_tokens
        to = ReplyTo(
            body=body,
            turn=turn,
            messages=messages,
            model=model_id,
            turns=turns,
            tenant=tenant,
            on_finish=conversation.commit if conversation is not None else None,
        )
        if conversation is not None:
            place = conversation.place()
        if body.background:
            place = place or await turns.place(tenant, previous)
            return await background.start(responses, to, place=place, metrics=metrics, held=stack.pop_all())
        # A stored turn's record is written by its commit, in the same step (the reply is made once it starts;
        # a turn that commits before its first event, if any could, saves it after).
        replies: list[Reply] = []
        stored = (
            (lambda outcome: replies[0].committed(outcome) if replies else None)
            if body.store is not False
            else None
        )
        if place is not None:
            source = turns.run_at(tenant, place, turn)
        else:
            source = turns.run(tenant, previous, turn, stored)
        events = timed(source, TokenTiming(metrics), _token_choice)
        try:
            started = await anext(events)  # errors before the turn holds its session are HTTP errors
        except BaseException:
            await events.aclose()
            raise
        assert isinstance(started, TurnStarted)
        turn_started(started.response_id, body.conversation_id or started.session_id)
        reply = Reply(to, started)
        replies.append(reply)
        if body.stream:
            numbered = NumberedEvents(reply)
            kept = stack.pop_all()  # the conversation stays held until the stream ends
            lines = ClosingStream(stream_events(reply, events, numbered), events, kept)
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
    record = await turns.find(tenant, response_id)
    if record is None:
        raise NotFound(f"no response {response_id[:100]!r}", param="response_id")
    return record


async def retrieve(
    responses: ResponsesServices, tenant: str, response_id: str, stream: bool, after: int | None
) -> Any:
    """A response as it stands: a background one's job (any replica has it), else the stored response. With
    `stream`, a background response's events after sequence number `after`, then those still to come."""
    job = await responses.jobs.find(tenant, response_id)
    if job is not None:
        if stream:
            return EventStream(background.follow(responses.jobs, tenant, response_id, after))
        return JSONResponse(job.response)
    record = await find(responses.turns, tenant, response_id)
    if stream:
        raise InvalidRequest(
            "only a background response can be streamed again (for about ten minutes)", param="stream"
        )
    return JSONResponse(record.response)


async def cancel(responses: ResponsesServices, tenant: str, response_id: str, wait_seconds: float) -> Any:
    """Cancels a background response that has not finished: nothing of it is committed (the session is as it
    was). One that finished is answered as it is: its step committed, and a cancel does not undo it."""
    job = await responses.jobs.find(tenant, response_id)
    if job is None:
        await find(responses.turns, tenant, response_id)  # 404 if there is no such response at all
        raise InvalidRequest("only a background response can be cancelled", param="response_id")
    job = await responses.jobs.cancel(tenant, job, wait_seconds)
    return JSONResponse(job.response)


async def delete(
    responses: ResponsesServices, tenant: str, response_id: str, wait_seconds: float
) -> DeletedResponse:
    """Forgets the response: its stored record and its background job, if any (one that runs is cancelled)."""
    job = await responses.jobs.find(tenant, response_id)
    record = await responses.turns.find(tenant, response_id)
    if job is None and record is None:
        raise NotFound(f"no response {response_id[:100]!r}", param="response_id")
    if job is not None:
        await responses.jobs.delete(tenant, job, wait_seconds)
        record = await responses.turns.find(tenant, response_id)  # a job that finished meanwhile saved it
    if record is not None:
        await responses.turns.forget(record)
    return DeletedResponse(id=response_id)


def list_input_items(
    record: ResponseRecord, after: str | None, limit: int, order: Literal["asc", "desc"]
) -> InputItemList:
    """A page of the input items of the response's own turn."""
    items = [InputMessageItem.model_validate(i) for i in record.input_items]
    return InputItemList(**page_of(items, after, limit, order, "this response's input"))
