"""What the session routes do: each step through the session service, as one JSON answer or a stream (progress
while a long text is fed; tokens as they are generated), and once per Idempotency-Key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio

from ...admission.classes import request_class
from ...errors import InvalidRequest
from ...metrics import Metrics
from ...sessions.events import ProgressEvent
from ...sessions.idempotency import IdempotentCall
from ...sessions.service import AppendOutcome, GenerateOutcome, SessionMeta, SessionService
from ...settings import Settings
from ..shared import sse
from ..shared.event_stream import EventStream
from ..shared.limits import check_metadata, check_stop, check_text, max_tokens_of
from ..shared.progress import Progress, ProgressThrottle, long_work, progress_event
from ..shared.text_log import log_text
from ..shared.timing import TokenTiming
from .protocol import (
    DEFAULT_MAX_TOKENS,
    AppendRequest,
    AppendResponse,
    GenerateRequest,
    GenerateResponse,
    RewindResponse,
    SessionCreate,
    SessionFork,
    SessionObject,
    Usage,
)

# ---------------------------------------------------------------------------------------------- lifecycle


async def create(
    service: SessionService,
    tenant: str,
    settings: Settings,
    idempotent: IdempotentCall,
    wanted: SessionCreate,
) -> Any:
    check_text(settings, wanted.text, "text")
    check_metadata(settings, wanted.metadata)
    log_text(settings, "new session", wanted.text)

    async def work(progress: Progress | None) -> dict[str, Any]:
        meta = await service.create(
            tenant,
            text=wanted.text,
            mem_len=wanted.mem_len,
            ttl_seconds=wanted.ttl_seconds,
            metadata=wanted.metadata,
            progress=progress,
            memory=wanted.memory,
            receipt=idempotent.receipt(_session_object),
            klass=request_class(tenant, wanted.service_tier),
        )
        return _session_object(meta)

    return await long_work(work, stream=wanted.stream, idempotent=idempotent, status_code=201)


async def fork(
    service: SessionService,
    tenant: str,
    settings: Settings,
    idempotent: IdempotentCall,
    session_id: str,
    body: SessionFork | None,
) -> dict[str, Any]:
    metadata = body.metadata if body is not None else None
    version = body.version if body is not None else None
    check_metadata(settings, metadata)

    async def work() -> dict[str, Any]:
        meta = await service.fork(
            tenant,
            session_id,
            metadata=metadata,
            version=version,
            receipt=idempotent.receipt(_session_object),
        )
        return _session_object(meta)

    return await idempotent.run(work)


async def rewind(
    service: SessionService, tenant: str, idempotent: IdempotentCall, session_id: str, version: int
) -> dict[str, Any]:
    def answer(meta: SessionMeta) -> dict[str, Any]:
        return RewindResponse(session=SessionObject.model_validate(meta)).model_dump()

    async def step() -> dict[str, Any]:
        return answer(
            await service.history.rewind(tenant, session_id, version, receipt=idempotent.receipt(answer))
        )

    return await idempotent.run(step)


async def import_snapshot(
    service: SessionService,
    tenant: str,
    idempotent: IdempotentCall,
    data: bytes,
    *,
    ttl_seconds: int | None,
    stream: bool,
) -> Any:
    if not data:
        raise InvalidRequest("send the snapshot as the request body", param="body")

    async def load(progress: Progress | None) -> dict[str, Any]:
        meta = await service.import_snapshot(
            tenant, data, ttl_seconds=ttl_seconds, receipt=idempotent.receipt(_session_object)
        )
        return _session_object(meta)

    return await long_work(load, stream=stream, idempotent=idempotent, status_code=201)


def _session_object(meta: SessionMeta) -> dict[str, Any]:
    return SessionObject.model_validate(meta).model_dump()


async def delete(service: SessionService, tenant: str, idempotent: IdempotentCall, session_id: str) -> None:
    """Deletes the session, once per Idempotency-Key (the deletion writes the key's record)."""
    receipt = idempotent.receipt(lambda _: {})
    await idempotent.run_unanswered(lambda: service.delete(tenant, session_id, receipt=receipt(None)))


def snapshot_headers(session_id: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="session-{session_id[:16]}.safetensors"'}


# ---------------------------------------------------------------------------------------------- steps


async def append(
    service: SessionService,
    tenant: str,
    settings: Settings,
    idempotent: IdempotentCall,
    session_id: str,
    body: AppendRequest,
) -> Any:
    check_text(settings, body.text, "text")
    klass = request_class(tenant, body.service_tier)

    def answer(outcome: AppendOutcome) -> dict[str, Any]:
        return AppendResponse(
            session=SessionObject.model_validate(outcome.session),
            tokens=outcome.tokens,
            logprob=outcome.logprob,
            service_tier=klass.tier.value,
        ).model_dump()

    async def step(progress: Progress | None) -> dict[str, Any]:
        receipt = idempotent.receipt(answer)
        outcome = await service.append(
            tenant, session_id, body.text, progress=progress, receipt=receipt, klass=klass
        )
        return answer(outcome)

    return await long_work(step, stream=body.stream, idempotent=idempotent)


async def generate(
    service: SessionService,
    tenant: str,
    settings: Settings,
    idempotent: IdempotentCall,
    metrics: Metrics,
    session_id: str,
    body: GenerateRequest,
) -> Any:
    """The generation's JSON, or its stream of tokens (with `stream`); a retry with the Idempotency-Key of a
    finished one gets its answer again (its tokens too, when streamed)."""
    timing = TokenTiming(metrics)
    check_text(settings, body.text, "text")
    sent = body.max_tokens if "max_tokens" in body.model_fields_set else None
    max_tokens = max_tokens_of(settings, sent, DEFAULT_MAX_TOKENS)
    stops = check_stop(settings, body.stop)
    if (stored := await idempotent.replay()) is not None:
        return EventStream(_replay(stored)) if body.stream else _without_tokens(stored)
    klass = request_class(tenant, body.service_tier)
    # The tokens as they are generated: the key's record, written by the generation's commit, replays them.
    tokens: list[dict[str, Any]] = []
    source = service.generate(
        tenant,
        session_id,
        text=body.text,
        max_tokens=max_tokens,
        sampling=body.sampling(),
        stop=stops,
        report_progress=body.stream,
        receipt=idempotent.receipt(
            lambda outcome: {**_response(outcome, klass.tier.value), "tokens": tokens}
        ),
        klass=klass,
    )
    try:
        # Errors before the first event (404, 409, 410, ...) are plain HTTP errors, not a 200 stream.
        first = await anext(source)
        if body.stream:
            return EventStream(_stream(first, source, idempotent, timing, tokens, klass.tier.value))
        item: Any = first
        while not isinstance(item, GenerateOutcome):
            timing.token()
            tokens.append(_token(item))
            item = await anext(source)
    except BaseException as exc:
        await idempotent.failed(exc)
        raise
    response = _response(item, klass.tier.value)
    await idempotent.succeeded({**response, "tokens": tokens})
    return response


def _token(event: Any) -> dict[str, Any]:
    return {"id": event.id, "text": event.text, "logprob": event.logprob}


def _response(outcome: GenerateOutcome, service_tier: str) -> dict[str, Any]:
    result = outcome.result
    return GenerateResponse(
        text=result.text,
        finish_reason=result.finish_reason,
        session=SessionObject.model_validate(outcome.session),
        usage=Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens),
        service_tier=service_tier,
    ).model_dump()


def _without_tokens(stored: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stored.items() if k != "tokens"}


async def _stream(
    first: Any,
    source: AsyncIterator[Any],
    call: IdempotentCall,
    timing: TokenTiming,
    tokens: list[dict[str, Any]],
    service_tier: str,
) -> AsyncIterator[str]:
    finished = False
    error: BaseException | None = None
    throttle = ProgressThrottle()
    try:
        item = first
        while True:
            if isinstance(item, ProgressEvent):  # a long text is being fed, before the first token
                if throttle.due(item.done, item.total):
                    yield progress_event(item.done, item.total)
                item = await anext(source)
                continue
            if isinstance(item, GenerateOutcome):
                response = _response(item, service_tier)
                finished = True
                await call.succeeded({**response, "tokens": tokens})
                yield sse.event(
                    {
                        "type": "done",
                        **{
                            k: response[k]
                            for k in ("finish_reason", "text", "session", "usage", "service_tier")
                        },
                    }
                )
                yield sse.DONE
                return
            timing.token()
            token = _token(item)
            tokens.append(token)
            yield sse.event({"type": "token", "token": token})
            item = await anext(source)
    except BaseException as exc:
        error = exc
        raise
    finally:  # an error ends the stream with its error event, then [DONE] (EventStream)
        # Shielded: when the client leaves, this runs inside a cancelled scope and must still release the
        # Idempotency-Key and close the generation (which cancels its job and commits nothing).
        with anyio.CancelScope(shield=True):
            if not finished:
                await call.failed(error)
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()


async def _replay(stored: dict[str, Any]) -> AsyncIterator[str]:
    for token in stored.get("tokens", []):
        yield sse.event({"type": "token", "token": token})
    yield sse.event({"type": "done", **_without_tokens(stored)})
    yield sse.DONE
