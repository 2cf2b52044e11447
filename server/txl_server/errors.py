"""The server's error types. Each maps to one HTTP status and one `type` in the error body:
`{"error": {"type": ..., "message": ..., "param": ...}}`. Messages are written for users: no internals."""

from __future__ import annotations


class ServiceError(Exception):
    status = 500
    type = "internal"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code  # a finer reason than the type, for clients to act on (e.g. "version_not_found")

    def body(self) -> dict:
        error: dict = {"type": self.type, "message": self.message, "param": self.param}
        if self.code is not None:
            error["code"] = self.code
        return {"error": error}


class InvalidRequest(ServiceError):
    status = 400
    type = "invalid_request"


class InvalidBody(InvalidRequest):
    """The body does not match the schema (the same type as 400, the status FastAPI's validation uses)."""

    status = 422


class IdempotencyKeyReused(ServiceError):
    """An Idempotency-Key sent again with a different request body (IETF Idempotency-Key draft: 422)."""

    status = 422
    type = "idempotency_key_reused"


class Unauthorized(ServiceError):
    status = 401
    type = "unauthorized"


class NotFound(ServiceError):
    """Also for a session that exists but belongs to another tenant: its existence is not revealed."""

    status = 404
    type = "not_found"


class Conflict(ServiceError):
    """Another step on the same session is in progress (one writer per session)."""

    status = 409
    type = "conflict"


class Gone(ServiceError):
    """The session exists but its memory was dropped (no persistence and no room)."""

    status = 410
    type = "gone"


class RequestTimeout(ServiceError):
    """The request's body did not arrive whole in time (TXL_BODY_TIMEOUT_SECONDS)."""

    status = 408
    type = "request_timeout"


class PayloadTooLarge(ServiceError):
    status = 413
    type = "payload_too_large"


class Overloaded(ServiceError):
    status = 429
    type = "overloaded"

    def __init__(
        self, message: str, *, retry_after: float = 1.0, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.retry_after = (
            retry_after  # seconds: computed from the server's load where it can be (admission/)
        )


class Unavailable(ServiceError):
    """A dependency (Redis, the block store) cannot serve the request now; the message says why, and whether
    anything was changed (by default nothing was). Retry-After says when a retry may succeed."""

    status = 503
    type = "unavailable"

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, retry_after: float = 1.0
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.retry_after = retry_after


class OutcomeUnknown(Unavailable):
    """A change was sent to the session store, which did not answer: it may or may not have been applied. The
    message says how to find out; a retry with the same Idempotency-Key gets the change's result either way."""

    def __init__(self, message: str, *, param: str | None = None, retry_after: float = 2.0) -> None:
        super().__init__(message, param=param, code="outcome_unknown", retry_after=retry_after)


class RowFailed(ServiceError):
    """This request's row of a batched step could not be computed (the model gave it no finite
    log-probabilities); the requests batched with it went on, and its session is unchanged."""

    def __init__(self) -> None:
        super().__init__(
            "the model gave no finite probabilities for this request's next token; nothing was committed",
            code="non_finite_logprobs",
        )
