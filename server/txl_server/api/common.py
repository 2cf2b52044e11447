"""What every route shares: the service and tenant of a request, input limits, the session object, streams."""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import AsyncIterable
from typing import Annotated, Any, Literal

import anyio
from fastapi import Depends, Header, Request
from pydantic import BaseModel, Field
from starlette.responses import StreamingResponse
from starlette.types import Send

from ..errors import InvalidRequest, PayloadTooLarge
from ..metrics import Metrics
from ..sessions.service import SessionService
from ..sessions.stateless import StatelessService
from ..sessions.store.sessions import SessionMeta
from ..settings import Settings
from . import sse


def get_service(request: Request) -> SessionService:
    service = request.app.state.runtime.service
    assert service is not None
    return service


def get_stateless(request: Request) -> StatelessService:
    stateless = request.app.state.runtime.stateless
    assert stateless is not None
    return stateless


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


def get_model_id(request: Request) -> str:
    model_id: str = request.app.state.runtime.model_id
    return model_id


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_tenant(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    tenant: str = request.app.state.api_keys.tenant(authorization)
    return tenant


Service = Annotated[SessionService, Depends(get_service)]
Stateless = Annotated[StatelessService, Depends(get_stateless)]
ModelId = Annotated[str, Depends(get_model_id)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
Tenant = Annotated[str, Depends(get_tenant)]
AppSettings = Annotated[Settings, Depends(get_settings)]


# ---------------------------------------------------------------------------------------------- logging

_text_log = logging.getLogger("txl_server.text")


def log_text(settings: Settings, what: str, text: str) -> None:
    """User text reaches the logs only when the operator opted in (TXL_LOG_PROMPTS=true)."""
    if settings.log_prompts:
        _text_log.info("%s: %r", what, text)


# ---------------------------------------------------------------------------------------------- limits


def check_unicode(text: str, param: str) -> None:
    """JSON can carry lone surrogates (`"\\ud800"`), which are not text: refuse them before they go anywhere."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{param} is not valid Unicode (a lone surrogate)", param=param) from None


def check_text(settings: Settings, text: str, param: str, *, allow_empty: bool = True) -> None:
    if not allow_empty and not text:
        raise InvalidRequest(f"{param} must not be empty", param=param)
    if len(text) > settings.max_text_chars:
        raise PayloadTooLarge(f"{param} is longer than {settings.max_text_chars} characters", param=param)
    check_unicode(text, param)


def check_stop(settings: Settings, stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > settings.max_stop_strings:
        raise InvalidRequest(f"at most {settings.max_stop_strings} stop strings", param="stop")
    for s in stops:
        if not s or len(s) > settings.max_stop_chars:
            raise InvalidRequest(
                f"stop strings must have 1 to {settings.max_stop_chars} characters", param="stop"
            )
    return stops


def check_metadata(settings: Settings, metadata: dict[str, Any] | None, *, max_depth: int = 4) -> None:
    if metadata is None:
        return

    def depth(value: Any) -> int:
        if isinstance(value, str):
            check_unicode(value, "metadata")
        if isinstance(value, dict):
            for key in value:
                check_unicode(key, "metadata")
            return 1 + max((depth(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return 1 + max((depth(v) for v in value), default=0)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest("metadata numbers must be finite", param="metadata")
        return 0

    if depth(metadata) > max_depth:
        raise InvalidRequest(f"metadata may nest at most {max_depth} levels", param="metadata")
    if len(json.dumps(metadata).encode()) > settings.max_metadata_bytes:
        raise InvalidRequest(
            f"metadata is larger than {settings.max_metadata_bytes} bytes as JSON", param="metadata"
        )


def check_max_tokens(settings: Settings, max_tokens: int) -> None:
    if max_tokens > settings.max_tokens:
        raise InvalidRequest(f"max_tokens must be at most {settings.max_tokens}", param="max_tokens")


# ---------------------------------------------------------------------------------------------- validation

_LOCATIONS = ("body", "query", "path", "header")
# Pydantic names the member of a union it tried in the location (`prompt.list[int].0`): not a field.
_TYPE_TAG = re.compile(r"^([a-z]+(-[a-z]+)*(\[.*\])?)$")
_TYPE_NAMES = {"str", "int", "float", "bool", "none", "dict", "list", "constrained-str", "constrained-int"}


def validation_message(errors: list[Any], content_type: str | None) -> tuple[str, str | None]:
    """One sentence naming the field, and the field, for the first of pydantic's (or FastAPI's) errors."""
    if not errors:
        return "the request is invalid", None
    first = errors[0]
    kind = first.get("type", "")
    loc = list(first.get("loc", ()))
    if kind == "json_invalid":  # FastAPI: loc ("body", offset), ctx {"error": json's message}
        detail = (first.get("ctx") or {}).get("error") or first.get("msg", "")
        where = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        return f"the body is not valid JSON ({detail}{where})", "body"
    path = [str(p) for p in loc if p not in _LOCATIONS and not (isinstance(p, str) and _is_type_tag(p))]
    field = ".".join(path)
    if not field and loc[:1] == ["body"] and kind == "missing":
        return "this request needs a JSON body (Content-Type: application/json)", "body"
    if not field and loc[:1] == ["body"]:
        media = (content_type or "").split(";")[0].strip().lower()
        if media != "application/json":
            sent = f"Content-Type {media}" if media else "no Content-Type"
            return f"send the body as JSON with Content-Type: application/json (this request had {sent})", (
                "Content-Type"
            )
        return "the body must be a JSON object", "body"
    message = str(first.get("msg", "invalid value"))
    if not field:
        return f"the request is invalid: {message}", None
    if kind == "missing":
        return f"{field} is required", field
    if kind == "extra_forbidden":
        return f"{field} is not a known field", field
    if message.startswith("Input should "):
        return f"{field} should {message.removeprefix('Input should ')}", field
    return f"{field}: {message.removeprefix('Value error, ')}", field


def _is_type_tag(part: str) -> bool:
    return part in _TYPE_NAMES or ("[" in part and _TYPE_TAG.match(part) is not None)


# ---------------------------------------------------------------------------------------------- sessions


class SessionObject(BaseModel):
    id: str
    object: Literal["session"] = "session"
    created_at: int
    expires_at: int
    tokens: int
    mem_tokens: int
    mem_len: int
    version: int
    model: str
    metadata: dict[str, Any]

    @classmethod
    def of(cls, meta: SessionMeta) -> SessionObject:
        return cls(
            id=meta.id,
            created_at=int(meta.created_at),
            expires_at=math.ceil(meta.expires_at),
            tokens=meta.tokens,
            mem_tokens=meta.mem_tokens,
            mem_len=meta.mem_len,
            version=meta.version,
            model=meta.model,
            metadata=meta.metadata,
        )


class ErrorDetail(BaseModel):
    type: Literal[
        "invalid_request",
        "idempotency_key_reused",
        "unauthorized",
        "not_found",
        "conflict",
        "gone",
        "payload_too_large",
        "overloaded",
        "unavailable",
        "internal",
    ]
    message: str
    param: str | None
    code: str | None = Field(None, description="A finer reason, where one helps (e.g. version_not_found)")


class ErrorBody(BaseModel):
    """Every error, with its HTTP status."""

    error: ErrorDetail


_ERRORS = {
    400: "invalid_request: a value the server refuses",
    401: "unauthorized: missing or wrong API key",
    404: "not_found: no such session (or another tenant's)",
    409: "conflict: another step on the session is in progress",
    410: "gone: the session's memory was dropped",
    413: "payload_too_large",
    422: "invalid_request: the body does not match the schema; idempotency_key_reused: a key sent again with "
    "another body",
    429: "overloaded: retry after Retry-After seconds",
    500: "internal",
    503: "unavailable: Redis is unreachable; nothing was changed",
}
# For `APIRouter(responses=...)`: the error shape on every route, in the OpenAPI document.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in _ERRORS.items()
}


class TokenTiming:
    """Time to first token and inter-token latency of one request (of each of its choices, for several)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics, self.started = metrics, time.perf_counter()
        self.first_seen = False
        self.last: dict[int, float] = {}

    def token(self, choice: int = 0) -> None:
        now = time.perf_counter()
        if not self.first_seen:
            self.first_seen = True
            self.metrics.time_to_first_token.observe(now - self.started)
        if choice in self.last:
            self.metrics.inter_token.observe(now - self.last[choice])
        self.last[choice] = now


PROGRESS_INTERVAL_SECONDS = 0.2


class ProgressThrottle:
    """Progress events a few times a second, and always the last one (done == total)."""

    def __init__(self) -> None:
        self.last = 0.0

    def due(self, done: int, total: int) -> bool:
        now = time.monotonic()
        if done >= total or now - self.last >= PROGRESS_INTERVAL_SECONDS:
            self.last = now
            return True
        return False


def progress_event(done: int, total: int) -> str:
    return sse.event({"type": "progress", "tokens_done": done, "tokens_total": total})


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


# ---------------------------------------------------------------------------------------------- streams


class EventStream(StreamingResponse):
    """An SSE response that always closes its source when the client goes away, so the generation stops
    (the source's `finally` cancels the job and nothing is committed)."""

    def __init__(self, source: AsyncIterable[str], status_code: int = 200) -> None:
        super().__init__(source, status_code=status_code, media_type=sse.MEDIA_TYPE, headers=sse.HEADERS)
        self._source = source

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self._source, "aclose", None)
                if aclose is not None:
                    await aclose()
