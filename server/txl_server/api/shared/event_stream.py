"""A server-sent event response that always ends properly, and stops its source when the client leaves; and the
routes that answer JSON or such a stream: how they are registered, and how the OpenAPI document describes them.

Every stream ends with its last event, or, whatever cut it short, with its route's error ending: an error the
source raises (a `ServiceError` with its status, anything else as a 500 `internal`, logged), or the shutdown
stopping it (`api/shutdown.py`, which asks the stream for its ending). Each family of routes ends its streams in
its own format (`StreamEnding`): the server's `{"type": "error", "error": {...}}` then `[DONE]` by default,
OpenAI's error object then `[DONE]` on completions and chat, an `error` event on the Responses API.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from typing import Any

import anyio
from fastapi import APIRouter
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ...errors import ServiceError
from . import sse
from .disconnect import Endpoint, watch_connection
from .error_shapes import INTERNAL_ERROR

log = logging.getLogger(__name__)

# (the error's HTTP status, the error in the server's shape) -> the SSE text that ends a stream cut short by it.
StreamEnding = Callable[[int, dict[str, Any]], str]
# Where a stream leaves its ending in the request's ASGI scope, for the shutdown to end it the same way.
STREAM_ENDING = "txl.stream_ending"


def native_ending(status: int, error: dict[str, Any]) -> str:
    """The server's own: `{"type": "error", "error": {...}}`, then `[DONE]`."""
    return sse.error_end(error)


class EventStream(StreamingResponse):
    """An SSE response that ends with `ending` when its source fails, and always closes its source when it ends
    or the client goes away, so the generation stops (the source's `finally` cancels the job and nothing is
    committed)."""

    def __init__(
        self, source: AsyncIterable[str], status_code: int = 200, *, ending: StreamEnding = native_ending
    ) -> None:
        self._events = _ended(source, ending)
        super().__init__(
            self._events, status_code=status_code, media_type=sse.MEDIA_TYPE, headers=sse.HEADERS
        )
        self._source, self.ending = source, ending

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[STREAM_ENDING] = self.ending
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._events.aclose()
                aclose = getattr(self._source, "aclose", None)
                if aclose is not None:
                    await aclose()


async def _ended(source: AsyncIterable[str], ending: StreamEnding) -> AsyncGenerator[str, None]:
    """The source's events; an error it raises ends them with `ending` (a cancellation is not an error: the
    client left, or the shutdown stops the stream and ends it itself)."""
    try:
        async for chunk in source:
            yield chunk
    except ServiceError as exc:
        yield ending(exc.status, exc.body()["error"])
    except Exception:
        log.exception("a stream failed after it began")
        yield ending(500, INTERNAL_ERROR)


def json_or_events(status: int, description: str) -> dict[int | str, dict[str, Any]]:
    """For a route's `responses`: its `status` answer is JSON, or (with `stream`) an event stream."""
    return {status: {"content": {sse.MEDIA_TYPE: {}}, "description": description}}


def json_or_stream_post(
    router: APIRouter,
    path: str,
    response_model: Any,
    description: str = "JSON, or SSE events with stream",
    status_code: int | None = None,
    **options: Any,
) -> Callable[[Endpoint], Endpoint]:
    """Registers `POST path` on `router`: it answers `response_model` as JSON (with `status_code`), or with
    `stream` an event stream, as `description` says in the OpenAPI document; its work stops when its client
    leaves before the answer (`watch_connection`)."""
    documented = json_or_events(status_code or 200, description)

    def register(endpoint: Endpoint) -> Endpoint:
        route = router.post(
            path, status_code=status_code, response_model=response_model, responses=documented, **options
        )
        return route(watch_connection(endpoint))

    return register
