"""The ASGI layers in front of every route that limit and count requests (the body's size, the requests in flight,
and the requests' metrics by route template), and the one that answers an error no handler took."""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import Overloaded, PayloadTooLarge
from ..metrics import Metrics
from .shared.error_shapes import INTERNAL_ERROR, error_response
from .shared.json_response import JSONResponse

log = logging.getLogger("txl_server")


class HttpMiddleware:
    """An ASGI layer over HTTP requests (`handle`); anything else (the lifespan) passes through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class _BodyTooLarge(PayloadTooLarge):
    pass


class BodyLimit(HttpMiddleware):
    """413 for a body over the limit, whether announced by Content-Length or streamed in chunks."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        super().__init__(app)
        self.limit = limit

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        too_large = _BodyTooLarge(f"the request body is larger than {self.limit} bytes", param="body")
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await error_response(too_large)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise too_large
            return message

        await self.app(scope, limited, send)


class ConcurrencyLimit(HttpMiddleware):
    """429 (with Retry-After) once `limit` API requests are in flight; streams count until they end."""

    def __init__(self, app: ASGIApp, limit: int, metrics: Metrics) -> None:
        super().__init__(app)
        self.limit, self.metrics = limit, metrics
        self.in_flight = 0

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self.metrics.overloaded.inc()
            busy = Overloaded(f"more than {self.limit} requests in flight; retry shortly", retry_after=1)
            await error_response(busy)(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


class RequestMetrics(HttpMiddleware):
    """Counts and times requests by route template and status (never by path: ids are not labels)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status: dict[str, Any] = {"code": 500}

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or ("/" if scope["path"] == "/" else "unmatched")
            method = scope.get("method", "GET")
            self.metrics.requests.labels(template, method, str(status["code"])).inc()
            self.metrics.request_seconds.labels(template, method).observe(time.perf_counter() - started)


class UnexpectedErrors(HttpMiddleware):
    """A 500 `internal` for an error no handler took (its traceback logged, nothing of it returned), answered
    inside the other layers: so it takes its route's error shape (OpenAIErrors) and names its replica, as every
    other error does. (Starlette's own answer comes from outside every layer, and uvicorn then logs the error
    again as "Exception in ASGI application".) A stream ends its own errors (`EventStream`)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception:
            if started:  # too late to answer: the connection is cut
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope["path"])
            await JSONResponse({"error": INTERNAL_ERROR}, status_code=500)(scope, receive, send)
