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

    def __init_subclass__(
        cls, *, status: int | None = None, type: str | None = None, code: str | None = None, **kwargs: Any
    ) -> None:
        """A class for one of the server's errors names its `type` (or the `code` of a case within a type),
        and the HTTP status it comes with; it is then what `error_from_body` makes of that error."""
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if type is not None:
            cls.type = type
            BY_TYPE[type] = cls
        if code is not None:
            cls.code = code
            BY_CODE[code] = cls

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


BY_TYPE: dict[str, type[TxlError]] = {}  # the class of each error `type` the server sends
BY_CODE: dict[str, type[TxlError]] = {}  # a `code` names a case within a type; it wins over the type


class InvalidRequest(TxlError, status=400, type="invalid_request"):
    """400 or 422: the request is malformed or a value is out of range; `param` names it."""


class IdempotencyKeyReused(InvalidRequest, status=422, type="idempotency_key_reused"):
    """422: an Idempotency-Key sent again with a different request (a key names one request: use a new one)."""


class Unauthorized(TxlError, status=401, type="unauthorized"):
    """401 (or 403): no API key, or not one the server knows."""


class NotFound(TxlError, status=404, type="not_found"):
    """No such session (or route). Also a session of another tenant: the server does not reveal it."""


class VersionNotFound(NotFound, code="version_not_found"):
    """A session version that does not exist or is no longer kept (its message names the oldest kept one)."""


class Conflict(TxlError, status=409, type="conflict"):
    """Another step on the same session is in progress (one writer per session). Retried, honouring
    Retry-After, with `retry_conflicts=True`."""


class Gone(TxlError, status=410, type="gone"):
    """The session exists but the server dropped its memory (no persistence and no room)."""


class PayloadTooLarge(TxlError, status=413, type="payload_too_large"):
    """413: the request's body is larger than the server takes."""


class Overloaded(TxlError, status=429, type="overloaded"):
    """429: too many requests in flight. `retry_after` is the server's Retry-After, in seconds."""


class Unavailable(TxlError, status=503, type="unavailable"):
    """503 (or a gateway's 502/504): a dependency of the server is down; nothing was changed."""


class InternalError(TxlError, status=500, type="internal"):
    """500: the server failed."""


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


# The class of an error body that is not the server's (a proxy's page), by its HTTP status.
BY_STATUS: dict[int, type[TxlError]] = {
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
            BY_CODE.get(code or "")
            or BY_TYPE.get(kind)
            or (BY_STATUS.get(status) if status else None)
            or _fallback(status)
        )
        param = error.get("param")
        message = error["message"]
    else:
        kind, code = "", None
        cls = (BY_STATUS.get(status) if status else None) or _fallback(status)
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
