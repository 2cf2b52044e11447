"""A server-sent event response that stops its source when the client leaves, and the routes that answer JSON or
such a stream: how they are registered, and how the OpenAPI document describes them."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from typing import Any

import anyio
from fastapi import APIRouter
from starlette.responses import StreamingResponse
from starlette.types import Send

from . import sse
from .disconnect import Endpoint, watch_connection


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
