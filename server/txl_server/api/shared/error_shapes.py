"""The server's own error shape, `{"error": {"type", "message", "param"}}` with its HTTP status: the schema the
OpenAPI document shows on every route, and the response of a `ServiceError` (with Retry-After where a retry
helps)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ...admission.retry import header_values
from ...errors import Conflict, Overloaded, ServiceError, Unavailable
from .json_response import JSONResponse

# A 409 comes after the request already waited TXL_LEASE_WAIT_SECONDS for the session's writer, which holds it
# for one step: a retry a second later usually finds the session free.
CONFLICT_RETRY_AFTER_SECONDS = 1
# What a client learns of an unexpected error: internals are logged, never returned.
INTERNAL_ERROR = {"type": "internal", "message": "internal error", "param": None}


def error_response(error: ServiceError) -> JSONResponse:
    headers = {}
    if isinstance(error, Overloaded):
        headers.update(header_values(error.retry_after))
    elif isinstance(error, Unavailable):
        headers["Retry-After"] = str(max(1, round(error.retry_after)))
    elif isinstance(error, Conflict):
        headers["Retry-After"] = str(CONFLICT_RETRY_AFTER_SECONDS)
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


class ErrorDetail(BaseModel):
    type: Literal[
        "invalid_request",
        "idempotency_key_reused",
        "unauthorized",
        "not_found",
        "conflict",
        "gone",
        "request_timeout",
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
    408: "request_timeout: the body did not arrive whole in time (the connection is closed)",
    410: "gone: the session's memory was dropped",
    413: "payload_too_large",
    422: "invalid_request: the body does not match the schema; idempotency_key_reused: a key sent again with "
    "another body",
    429: "overloaded: refused at once, retry after Retry-After seconds (retry-after-ms: exactly); code: why "
    "(first_token_target, flex_capacity, server_concurrency, tenant_concurrency, tenant_share, queue_full, "
    "device_memory_full: docs/api.md)",
    500: "internal",
    503: "unavailable: Redis is unreachable, nothing was changed; (code server_shutting_down): the server is "
    "shutting down",
}
# Where a retry helps, the answer says when (`error_response`).
RETRY_AFTER: dict[str, Any] = {
    "Retry-After": {
        "description": "Seconds to wait before a retry",
        "schema": {"type": "integer"},
        "required": True,
    }
}


# A refusal's Retry-After, to the millisecond (OpenAI's SDKs read it before Retry-After).
RETRY_AFTER_MS: dict[str, Any] = {
    "retry-after-ms": {
        "description": "Milliseconds to wait before a retry, computed from the server's queue",
        "schema": {"type": "integer"},
        "required": True,
    }
}


def error_responses(descriptions: dict[int, str], body: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """For `APIRouter(responses=...)`: each status with its description and `body`'s schema (and Retry-After
    where every such answer has one)."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status, text in descriptions.items():
        responses[status] = {"model": body, "description": text}
        if status == 409:
            responses[status]["headers"] = RETRY_AFTER
        elif status == 429:
            responses[status]["headers"] = {**RETRY_AFTER, **RETRY_AFTER_MS}
    return responses


# The error shape on every native route, in the OpenAPI document.
ERROR_RESPONSES = error_responses(_ERRORS, ErrorBody)
