"""Typed exceptions, built from the server's one error shape `{"error": {"type", "message", "param"}}`.

Every HTTP error and every `{"type": "error"}` event of a stream becomes a `TxlError` subclass chosen by the
error's `type` (or, for a body that is not the server's, e.g. from a proxy, by the HTTP status). Transport
failures (refused connection, dropped connection, timeout) are `TxlConnectionError`.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from typing import Any


class TxlError(Exception):
    """Base of every error this package raises. `status` is None for errors that never got an HTTP status;
    `retry_after` is the response's Retry-After, in seconds, when it had one (429, 409, 503)."""

    status: int | None = None
    type: str = "error"
    code: str | None = None  # the error's `code`, where the server names the case (e.g. version_not_found)

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.__class__.code
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.param = param
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f" (param: {self.param})" if self.param else ""
        code = f"{self.status} " if self.status is not None else ""
        return f"{code}{self.type}: {self.message}{where}"


class InvalidRequest(TxlError):
    """400 or 422: the request is malformed or a value is out of range; `param` names it."""

    status, type = 400, "invalid_request"


class IdempotencyKeyReused(InvalidRequest):
    """422: an Idempotency-Key sent again with a different request (a key names one request: use a new one)."""

    status, type = 422, "idempotency_key_reused"


class Unauthorized(TxlError):
    status, type = 401, "unauthorized"


class NotFound(TxlError):
    """No such session (or route). Also a session of another tenant: the server does not reveal it."""

    status, type = 404, "not_found"


class VersionNotFound(NotFound):
    """A session version that does not exist or is no longer kept (its message names the oldest kept one)."""

    code = "version_not_found"


class Conflict(TxlError):
    """Another step on the same session is in progress (one writer per session). Retried, honouring
    Retry-After, with `retry_conflicts=True`."""

    status, type = 409, "conflict"


class Gone(TxlError):
    """The session exists but the server dropped its memory (no persistence and no room)."""

    status, type = 410, "gone"


class PayloadTooLarge(TxlError):
    status, type = 413, "payload_too_large"


class Overloaded(TxlError):
    """429: too many requests in flight. `retry_after` is the server's Retry-After, in seconds."""

    status, type = 429, "overloaded"


class Unavailable(TxlError):
    """503 (or a gateway's 502/504): a dependency of the server is down; nothing was changed."""

    status, type = 503, "unavailable"


class InternalError(TxlError):
    status, type = 500, "internal"


class TxlConnectionError(TxlError, builtins.ConnectionError):
    """The request or its response was lost in transport (refused, reset, dropped mid-stream).

    `sent` is False when the request certainly never reached the server (the connection was refused).
    """

    type = "connection"

    def __init__(self, message: str, *, sent: bool = True, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.sent = sent

    def __str__(self) -> str:
        return self.message


class TxlTimeoutError(TxlConnectionError, builtins.TimeoutError):
    type = "timeout"


_BY_TYPE: dict[str, type[TxlError]] = {
    cls.type: cls
    for cls in (
        InvalidRequest,
        IdempotencyKeyReused,
        Unauthorized,
        NotFound,
        Conflict,
        Gone,
        PayloadTooLarge,
        Overloaded,
        Unavailable,
        InternalError,
    )
}
# A `code` names a case within a type; it wins over the type where a class stands for it.
_BY_CODE: dict[str, type[TxlError]] = {"version_not_found": VersionNotFound}

_BY_STATUS: dict[int, type[TxlError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    422: InvalidRequest,
    429: Overloaded,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    value = (headers or {}).get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: rare enough to treat as "unspecified"
        return None


def error_from_body(
    body: Any, *, status: int | None = None, headers: Mapping[str, str] | None = None
) -> TxlError:
    """The exception for an error body (`{"error": {...}}`) or an SSE error event (`{"type": "error", "error": ...}`)."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        kind = str(error.get("type") or "")
        code = error.get("code") if isinstance(error.get("code"), str) else None
        cls = (
            _BY_CODE.get(code or "")
            or _BY_TYPE.get(kind)
            or (_BY_STATUS.get(status) if status else None)
            or _fallback(status)
        )
        param = error.get("param")
        message = error["message"]
    else:
        kind, code = "", None
        cls = (_BY_STATUS.get(status) if status else None) or _fallback(status)
        param = None
        message = f"HTTP {status}" if status else "unknown error"
    kwargs: dict[str, Any] = {
        "status": status or cls.status,
        "param": param if isinstance(param, str) else None,
        "retry_after": _retry_after(headers),
        "code": code,
    }
    if kind:
        kwargs["type"] = kind
    return cls(message, **kwargs)


def error_from_response(status: int, content: bytes, headers: Mapping[str, str]) -> TxlError:
    try:
        body = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        body = None
    error = error_from_body(body, status=status, headers=headers)
    if body is None and content:  # not the server's shape (a proxy's page): keep a readable excerpt
        error.message = f"HTTP {status}: {content[:200].decode('utf-8', errors='replace').strip()}"
        error.args = (error.message,)
    return error


def _fallback(status: int | None) -> type[TxlError]:
    if status is not None and 400 <= status < 500:
        return InvalidRequest
    return InternalError
