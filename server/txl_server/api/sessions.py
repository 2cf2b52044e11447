"""Session routes: create, list, get, delete, fork, append, generate (JSON or SSE)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from txl.sampling import SamplingParams

from ..errors import InvalidRequest, ServiceError
from ..sessions.events import ProgressEvent
from ..sessions.service import GenerateOutcome
from . import sse
from .common import (
    ERROR_RESPONSES,
    AppSettings,
    EventStream,
    ProgressThrottle,
    Service,
    SessionObject,
    Tenant,
    TokenTiming,
    Usage,
    check_max_tokens,
    check_metadata,
    check_stop,
    check_text,
    log_text,
    progress_event,
)
from .disconnect import watch_connection
from .idempotency import Idempotent, IdempotentCall
from .json_body import JsonBodyRoute
from .progress import Progress, long_work, streamed_responses

log = logging.getLogger(__name__)
router = APIRouter(
    prefix="/v1/sessions", tags=["sessions"], responses=ERROR_RESPONSES, route_class=JsonBodyRoute
)

MAX_SEED = 2**63 - 1


STREAM_DESCRIPTION = (
    "Answer with SSE: progress events while the text is fed (and keep-alive comments), then a `result` event "
    "holding the JSON answer. A long text then never times out a client."
)


class SessionCreate(BaseModel):
    # The example is what the API docs' sample bodies show: without one, they show each field's minimum
    # (mem_len 0, ttl_seconds 1), a session with no memory that expires in a second.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"text": "It was a dark and stormy night", "metadata": {"user": "ada"}}]
        },
    )
    text: str = Field("", description="Text the session starts with (may be empty)")
    mem_len: int | None = Field(None, ge=0, description="Positions of memory to keep; default: the model's")
    ttl_seconds: int | None = Field(
        None, ge=1, examples=[3600], description="Expires this long after its last use; default: the server's"
    )
    metadata: dict[str, Any] | None = Field(None, description="Your own JSON, returned with the session")
    stream: bool = Field(False, description=STREAM_DESCRIPTION)
    memory: str | None = Field(
        None,
        max_length=64,
        description="Start from this preloaded memory (POST /v1/memories): as if its document came before `text`",
    )


class SessionFork(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, Any] | None = Field(
        None, description="Metadata of the new session; default: the parent's"
    )
    version: int | None = Field(
        None, ge=1, description="Fork this kept version (GET .../versions); default: the newest"
    )


class SessionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SessionObject]


class AppendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(..., description="Text to add to the session")
    stream: bool = Field(False, description=STREAM_DESCRIPTION)


class AppendResponse(BaseModel):
    session: SessionObject
    tokens: int = Field(..., description="Tokens the text became")
    logprob: float = Field(..., description="Natural-log probability of those tokens given everything before")


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    text: str = Field("", description="Text to add before generating")
    # 256: a few sentences of a byte-level model (the bundled one), a paragraph of a word-level one.
    max_tokens: int = Field(256, ge=0, description="Tokens to generate (fewer if a stop string appears)")
    temperature: float = Field(1.0, ge=0, le=100, description="0: greedy")
    top_k: int = Field(0, ge=0, description="0: no limit")
    top_p: float = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = Field(
        None, description="Generation ends before the first of these strings"
    )
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stream: bool = False

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed
        )


class GenerateResponse(BaseModel):
    text: str
    finish_reason: Literal["length", "stop"]
    session: SessionObject
    usage: Usage


# ---------------------------------------------------------------------------------------------- lifecycle


@router.post("", status_code=201, response_model=SessionObject, responses=streamed_responses(201))
@watch_connection
async def create_session(
    service: Service,
    tenant: Tenant,
    settings: AppSettings,
    idempotent: Idempotent,
    body: SessionCreate | None = None,
) -> Any:
    """A new session, primed with `text` (after a preloaded memory's document, with `memory`). The body may be
    omitted (an empty session with the defaults)."""
    wanted = body or SessionCreate()
    check_text(settings, wanted.text, "text")
    check_metadata(settings, wanted.metadata)
    log_text(settings, "new session", wanted.text)

    async def create(progress: Progress | None) -> dict[str, Any]:
        meta = await service.create(
            tenant,
            text=wanted.text,
            mem_len=wanted.mem_len,
            ttl_seconds=wanted.ttl_seconds,
            metadata=wanted.metadata,
            progress=progress,
            memory=wanted.memory,
        )
        return SessionObject.of(meta).model_dump()

    return await long_work(create, stream=wanted.stream, idempotent=idempotent, status_code=201)


@router.get("", response_model=SessionList)
async def list_sessions(service: Service, tenant: Tenant) -> SessionList:
    return SessionList(data=[SessionObject.of(m) for m in await service.list_sessions(tenant)])


@router.get("/{session_id}", response_model=SessionObject)
async def get_session(session_id: str, service: Service, tenant: Tenant) -> SessionObject:
    return SessionObject.of(await service.get(tenant, session_id))


@router.delete("/{session_id}", status_code=204)
async def delete_session(
    session_id: str, service: Service, tenant: Tenant, idempotent: Idempotent
) -> Response:
    async def delete() -> dict[str, Any]:
        await service.delete(tenant, session_id)
        return {}

    await idempotent.run(delete)
    return Response(status_code=204)


@router.post("/{session_id}/fork", status_code=201, response_model=SessionObject)
async def fork_session(
    session_id: str,
    service: Service,
    tenant: Tenant,
    settings: AppSettings,
    idempotent: Idempotent,
    body: SessionFork | None = None,
) -> Any:
    metadata = body.metadata if body is not None else None
    version = body.version if body is not None else None
    check_metadata(settings, metadata)

    async def fork() -> dict[str, Any]:
        meta = await service.fork(tenant, session_id, metadata=metadata, version=version)
        return SessionObject.of(meta).model_dump()

    return await idempotent.run(fork)


# ---------------------------------------------------------------------------------------------- snapshots


@router.get(
    "/{session_id}/snapshot",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "A safetensors blob"}},
)
async def export_snapshot(session_id: str, service: Service, tenant: Tenant) -> Response:
    """The session's memory and metadata as one safetensors file, to import elsewhere."""
    data = await service.export_snapshot(tenant, session_id)
    headers = {"Content-Disposition": f'attachment; filename="session-{session_id[:16]}.safetensors"'}
    return Response(data, media_type="application/octet-stream", headers=headers)


@router.post(
    "/import",
    status_code=201,
    response_model=SessionObject,
    responses=streamed_responses(201),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
@watch_connection
async def import_snapshot(
    request: Request,
    service: Service,
    tenant: Tenant,
    idempotent: Idempotent,
    ttl_seconds: int | None = Query(None, ge=1, description="Expires this long after its last use"),
    stream: bool = Query(False, description=STREAM_DESCRIPTION),
) -> Any:
    """A new session (new id, owned by the caller) from a snapshot exported by any TXL Serve of this model."""
    data = await request.body()
    if not data:
        raise InvalidRequest("send the snapshot as the request body", param="body")

    async def load(progress: Progress | None) -> dict[str, Any]:
        meta = await service.import_snapshot(tenant, data, ttl_seconds=ttl_seconds)
        return SessionObject.of(meta).model_dump()

    return await long_work(load, stream=stream, idempotent=idempotent, status_code=201)


# ---------------------------------------------------------------------------------------------- steps


@router.post("/{session_id}/append", response_model=AppendResponse, responses=streamed_responses(200))
@watch_connection
async def append(
    session_id: str,
    body: AppendRequest,
    service: Service,
    tenant: Tenant,
    settings: AppSettings,
    idempotent: Idempotent,
) -> Any:
    check_text(settings, body.text, "text", allow_empty=False)

    async def step(progress: Progress | None) -> dict[str, Any]:
        outcome = await service.append(tenant, session_id, body.text, progress=progress)
        return AppendResponse(
            session=SessionObject.of(outcome.session), tokens=outcome.tokens, logprob=outcome.logprob
        ).model_dump()

    return await long_work(step, stream=body.stream, idempotent=idempotent)


@router.post(
    "/{session_id}/generate",
    response_model=GenerateResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE events with stream=true"}
    },
)
@watch_connection
async def generate(
    session_id: str,
    body: GenerateRequest,
    request: Request,
    service: Service,
    tenant: Tenant,
    settings: AppSettings,
    idempotent: Idempotent,
) -> Any:
    timing = TokenTiming(request.app.state.metrics)
    check_text(settings, body.text, "text")
    check_max_tokens(settings, body.max_tokens)
    stops = check_stop(settings, body.stop)
    if (stored := await idempotent.replay()) is not None:
        return EventStream(_replay(stored)) if body.stream else _without_tokens(stored)
    source = service.generate(
        tenant,
        session_id,
        text=body.text,
        max_tokens=body.max_tokens,
        sampling=body.sampling(),
        stop=stops,
        report_progress=body.stream,
    )
    try:
        # Errors before the first event (404, 409, 410, ...) are plain HTTP errors, not a 200 stream.
        first = await anext(source)
        if body.stream:
            return EventStream(_stream(first, source, idempotent, timing))
        tokens: list[dict[str, Any]] = []
        item: Any = first
        while not isinstance(item, GenerateOutcome):
            timing.token()
            tokens.append(_token(item))
            item = await anext(source)
    except BaseException:
        await idempotent.failed()
        raise
    response = _response(item)
    await idempotent.succeeded({**response, "tokens": tokens})
    return response


def _token(event: Any) -> dict[str, Any]:
    return {"id": event.id, "text": event.text, "logprob": event.logprob}


def _response(outcome: GenerateOutcome) -> dict[str, Any]:
    result = outcome.result
    return GenerateResponse(
        text=result.text,
        finish_reason=result.finish_reason,
        session=SessionObject.of(outcome.session),
        usage=Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens),
    ).model_dump()


def _without_tokens(stored: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stored.items() if k != "tokens"}


async def _stream(
    first: Any, source: AsyncIterator[Any], call: IdempotentCall, timing: TokenTiming
) -> AsyncIterator[str]:
    tokens: list[dict[str, Any]] = []
    finished = False
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
                response = _response(item)
                finished = True
                await call.succeeded({**response, "tokens": tokens})
                yield sse.event(
                    {
                        "type": "done",
                        **{k: response[k] for k in ("finish_reason", "text", "session", "usage")},
                    }
                )
                yield sse.DONE
                return
            timing.token()
            token = _token(item)
            tokens.append(token)
            yield sse.event({"type": "token", "token": token})
            item = await anext(source)
    except ServiceError as exc:
        yield sse.event({"type": "error", **exc.body()})
        yield sse.DONE
    except Exception:
        log.exception("generation failed mid-stream")
        yield sse.event(
            {"type": "error", "error": {"type": "internal", "message": "internal error", "param": None}}
        )
        yield sse.DONE
    finally:
        # Shielded: when the client leaves, this runs inside a cancelled scope and must still release the
        # Idempotency-Key and close the generation (which cancels its job and commits nothing).
        with anyio.CancelScope(shield=True):
            if not finished:
                await call.failed()
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()


async def _replay(stored: dict[str, Any]) -> AsyncIterator[str]:
    for token in stored.get("tokens", []):
        yield sse.event({"type": "token", "token": token})
    yield sse.event({"type": "done", **_without_tokens(stored)})
    yield sse.DONE
