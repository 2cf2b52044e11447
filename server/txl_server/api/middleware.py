"""The ASGI layers in front of every route that limit and count requests (the body's size and the time it takes to
arrive, the requests in flight per tenant, and the requests' metrics by route template), and the one that answers
an error no handler took.

A slow or idle client holds nothing but its connection: the body is read whole first, within its deadline
(`BodyReader`: else 408 and the connection closed), and only then does the request take a concurrency slot of
its key's tenant (`RequestSlots`, admission.slots): a request without a valid key takes none (its route answers
401). The head's own deadline is the HTTP server's (serving.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..admission.slots import TenantSlots
from ..errors import Overloaded, PayloadTooLarge, RequestTimeout, ServiceError, Unauthorized
from ..metrics import Metrics
from .shared.auth import ApiKeys
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


class BodyReader(HttpMiddleware):
    """Reads each request's body whole before the app runs, within `timeout` seconds of its head; a body sent too
    slowly, or that never ends, is answered 408 (`request_timeout`) and its connection closed. The app then reads
    the body from memory, and the connection only for the client's leaving."""

    def __init__(self, app: ASGIApp, timeout: float) -> None:
        super().__init__(app)
        self.timeout = timeout

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        chunks: list[bytes] = []
        more = True
        while more:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                late = RequestTimeout(f"the request's body did not arrive within {self.timeout:g} seconds")
                await _closing(late, scope, receive, send)
                return
            except ServiceError as exc:  # the body's size limit (BodyLimit), with the rest of it unread
                await _closing(exc, scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return  # the client left before its request was whole: nothing ran
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        whole: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal whole
            if whole is None:
                return await receive()
            message, whole = whole, None
            return message

        await self.app(scope, replay, send)


async def _closing(error: ServiceError, scope: Scope, receive: Receive, send: Send) -> None:
    response = error_response(error)
    response.headers["Connection"] = "close"  # the rest of the body is never read
    await response(scope, receive, send)


class RequestSlots(HttpMiddleware):
    """API requests in flight, per tenant (admission.slots): a request of a valid key takes a slot of its tenant
    once its body is read (`BodyReader` runs first), and holds it until its answer (a stream: its last byte) is
    sent; beyond the limits it is refused at once, 429 with Retry-After. One tenant cannot take another's slots."""

    def __init__(self, app: ASGIApp, slots: TenantSlots, keys: ApiKeys, metrics: Metrics) -> None:
        super().__init__(app)
        self.slots, self.keys, self.metrics = slots, keys, metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        try:
            tenant = self.keys.tenant(Headers(scope=scope).get("authorization"))
        except Unauthorized:  # its route answers 401, having held nothing
            await self.app(scope, receive, send)
            return
        refused = self.slots.take(tenant)
        if refused is not None:
            self.metrics.refused(None, refused.reason)
            busy = Overloaded(refused.message, retry_after=refused.retry_after, code=refused.reason)
            await error_response(busy)(scope, receive, send)
            return
        started = time.monotonic()
        try:
            await self.app(scope, receive, send)
        finally:
            self.slots.give_back(tenant, time.monotonic() - started)


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
