"""Errors of the OpenAI-compatible routes (completions, chat, models, responses, vLLM's tokenizer routes) in OpenAI's shape and statuses, so
that OpenAI clients read them as they read OpenAI's own: `{"error": {"message", "type", "param", "code"}}`.

The rest of the server answers in its own documented shape (`{"error": {"type", "message", "param"}}`, errors.py);
a middleware rewrites the error responses of the OpenAI routes, whatever raised them (a route, a dependency such
as authentication, the body and concurrency limits in front of the routes, or the shutdown):

- the status stays, except that a request that does not match the schema (a value out of range, a wrong type) is
  400, not 422;
- `type` is `invalid_request_error` for a 4xx (OpenAI's word for them all), `requests` for 429 (as OpenAI's
  rate limits), `server_error` for a 5xx;
- `code` is the error's own code where it has one (`model_not_found` for an unknown model,
  `previous_response_not_found`, `server_shutting_down`), `invalid_api_key` for a 401, null for other invalid
  requests, else the server's own type (`not_found`, `conflict`, `gone`, `payload_too_large`, `overloaded`,
  `internal`, `unavailable`).

A completions or chat stream that fails after it began ends with an event holding the same object, then
`data: [DONE]` (`openai_ending`), as OpenAI's API does; a Responses stream with its `error` event.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...errors import NotFound
from . import sse
from .error_shapes import error_responses
from .json_response import json_bytes

# The OpenAI routes: these paths, and everything under them (`/v1/models/{model}`, `/v1/responses/{id}`); and
# vLLM's tokenizer routes, which answer as vLLM's do.
OPENAI_PATHS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/v1/responses",
    "/v1/conversations",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
)
MODEL_NOT_FOUND = "model_not_found"


def is_openai_path(path: str) -> bool:
    return any(path == route or path.startswith(route + "/") for route in OPENAI_PATHS)


class ModelNotFound(NotFound):
    """A `model` this server does not serve."""

    def __init__(self, model: str, served: str) -> None:
        shown = model if len(model) <= 100 else model[:100] + "..."
        super().__init__(
            f"the model {shown!r} does not exist; this server serves {served!r}",
            param="model",
            code=MODEL_NOT_FOUND,
        )


def openai_body(status: int, error: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's error object for a native `error` (`{"type", "message", "param"}`) answered with `status`."""
    native = str(error.get("type") or "")
    if status >= 500:
        kind = "server_error"
    elif status == 429:
        kind = "requests"
    else:
        kind = "invalid_request_error"
    code: str | None
    if error.get("code"):
        code = str(error["code"])
    elif status == 401:
        code = "invalid_api_key"
    elif native == "invalid_request":
        code = None
    else:
        code = native or None
    return {
        "error": {"message": error.get("message"), "type": kind, "param": error.get("param"), "code": code}
    }


def openai_status(status: int) -> int:
    # FastAPI answers 422 to a body that does not match the schema; OpenAI answers 400 to every invalid request.
    return 400 if status == 422 else status


def error_body(path: str, status: int, error: dict[str, Any]) -> dict[str, Any]:
    """The body of `error` (in the server's shape) answered with `status` on `path`, in the path's family's shape."""
    return openai_body(status, error) if is_openai_path(path) else {"error": error}


def openai_ending(status: int, error: dict[str, Any]) -> str:
    """The end of a completions or chat stream cut short by `error`: its event in OpenAI's shape, then `[DONE]`."""
    return sse.event(openai_body(status, error)) + sse.DONE


class OpenAIErrors:
    """Rewrites the JSON error responses of the OpenAI routes into OpenAI's shape (see the module's docstring);
    everything else passes untouched, streams included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_openai_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        held: Message | None = None  # the start of an error response, until its body is complete
        body = b""

        async def rewrite(message: Message) -> None:
            nonlocal held, body
            if message["type"] == "http.response.start" and message["status"] >= 400 and _is_json(message):
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            body += message.get("body", b"")
            if message.get("more_body", False):
                return
            status, content = _rewritten(held["status"], body)
            headers = [
                (name, value)
                for name, value in held.get("headers", [])
                if name.lower() not in (b"content-length", b"content-type")
            ]
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(content)).encode()),
            ]
            await send({**held, "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": content})

        await self.app(scope, receive, rewrite)


def _is_json(start: Message) -> bool:
    for name, value in start.get("headers", []):
        if name.lower() == b"content-type":
            return bytes(value).split(b";")[0].strip() == b"application/json"
    return False


def _rewritten(status: int, body: bytes) -> tuple[int, bytes]:
    try:
        error = json.loads(body)["error"]
        if not isinstance(error, dict):
            raise TypeError("not an error object")
    except (ValueError, KeyError, TypeError):  # not the server's error shape: leave it be
        return status, body
    return openai_status(status), json_bytes(openai_body(status, error))


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(BaseModel):
    """Every error of an OpenAI-compatible route, with its HTTP status."""

    error: OpenAIErrorDetail


_ERRORS = {
    400: "invalid_request_error: a value the server refuses, or a body that does not match the schema; on "
    "/v1/responses, (code previous_response_not_found): a previous response that cannot be continued",
    401: "invalid_request_error (code invalid_api_key): missing or wrong API key",
    404: "invalid_request_error (code model_not_found): an unknown model; (code not_found): an unknown session or "
    "response",
    409: "invalid_request_error (code conflict): another step on the session is in progress",
    408: "invalid_request_error (code request_timeout): the body did not arrive whole in time",
    410: "invalid_request_error (code gone): the session's memory was dropped",
    413: "invalid_request_error (code payload_too_large)",
    429: "requests (code: why, e.g. first_token_target, flex_capacity, tenant_share): refused at once, retry "
    "after Retry-After seconds (retry-after-ms: exactly)",
    500: "server_error (code internal)",
    503: "server_error (code unavailable): Redis is unreachable, nothing was changed; (code server_shutting_down): "
    "the server is shutting down",
}
# The error shape on every OpenAI route, in the OpenAPI document.
OPENAI_ERROR_RESPONSES = error_responses(_ERRORS, OpenAIErrorBody)
