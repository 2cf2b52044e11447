"""The FastAPI application: `create_app(settings)`.

The lifespan starts the runtime (model, worker, Redis, sessions) and always stops it; on SIGTERM/SIGINT the
requests are drained first (`api/shutdown.py`). Every error leaves as
`{"error": {"type", "message", "param"}}` with its HTTP status; internals are logged, never returned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..errors import Conflict, Overloaded, PayloadTooLarge, ServiceError
from ..metrics import Metrics
from ..runtime import LoadedModel, Runtime
from ..settings import Settings
from . import chat, completions, history, memories, responses, score, sessions, system
from .auth import ApiKeys
from .common import validation_message
from .disconnect import CLIENT_CLOSED_REQUEST, ClientGone
from .openai_errors import OpenAIErrors
from .replica import REPLICA_HEADER, ReplicaHeader, replica_name
from .shutdown import Shutdown, ShutdownGate

log = logging.getLogger("txl_server")
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def create_app(settings: Settings, *, loaded: LoadedModel | None = None) -> FastAPI:
    """The application; `loaded` is a model already loaded from `settings` (else the lifespan loads it)."""
    metrics = Metrics()
    shutdown = Shutdown(settings.shutdown_grace_seconds)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(settings, worker_observer=metrics, session_observer=metrics, loaded=loaded)
        app.state.runtime = runtime
        shutdown.on_begin = runtime.begin_shutdown
        shutdown.reserve = runtime.save_reserve
        try:
            await runtime.start()
        except Exception as exc:
            log.error("cannot start: %s", exc)
            await runtime.stop()
            raise
        if runtime.worker is not None:  # the endpoint picker's pool gauges (metrics.py)
            metrics.watch_pool(runtime.worker.pool)
        log.info("serving %s from %s", runtime.model_id, settings.model_dir)
        try:
            yield
        finally:  # after the drain (api/shutdown.py), within what is left of the grace period
            await runtime.stop(deadline=shutdown.deadline)

    # FastAPIOffline: FastAPI whose /docs and /redoc load Swagger UI and ReDoc from files installed with the
    # server (the fastapi-offline wheel), not from a CDN, so that the API docs work on an air-gapped host.
    app = FastAPIOffline(
        title="TXL Serve",
        version=__version__,
        description="Stateful Transformer-XL inference: sessions with cached segment memory, streaming, scoring, "
        "and an OpenAI-compatible completions API.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.shutdown = shutdown
    app.state.api_keys = ApiKeys.from_settings(settings)
    app.state.started_at = time.time()
    app.state.replica = replica_name(settings)
    for module in (sessions, history, memories, score, completions, chat, responses, system):
        app.include_router(module.router)
    _install_error_handlers(app)
    # Outermost first: metrics see every response, including the limits' 413 and 429.
    app.add_middleware(ConcurrencyLimit, limit=settings.max_concurrent_requests, metrics=metrics)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(ShutdownGate, shutdown=shutdown)
    # The errors of the OpenAI routes, the limits' included, in OpenAI's shape.
    app.add_middleware(OpenAIErrors)
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.add_middleware(ReplicaHeader, replica=app.state.replica)
    app.mount("/", Fallback(app, STATIC_DIR), name="playground")
    return app


# A 409 comes after the request already waited TXL_LEASE_WAIT_SECONDS for the session's writer: steps take
# tens of milliseconds to seconds, so a retry a second later usually finds the session free.
CONFLICT_RETRY_AFTER_SECONDS = 1


def error_response(error: ServiceError) -> JSONResponse:
    headers = {}
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(max(1, round(error.retry_after)))
    elif isinstance(error, Conflict):
        headers["Retry-After"] = str(CONFLICT_RETRY_AFTER_SECONDS)
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()), request.headers.get("content-type"))
        body = {"error": {"type": "invalid_request", "message": message, "param": param}}
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "invalid_request", 401: "unauthorized", 413: "payload_too_large"}.get(
            exc.status_code, "invalid_request" if exc.status_code < 500 else "internal"
        )
        message = str(exc.detail)
        if (
            exc.status_code == 404 and message == "Not Found"
        ):  # Starlette's own word for a path nothing serves
            message = f"no such route: {request.method} {request.url.path}"
        return JSONResponse(
            {"error": {"type": kind, "message": message, "param": None}},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it: for the metrics and access log

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        body = {"error": {"type": "internal", "message": "internal error", "param": None}}
        # Starlette sends this one from outside every middleware: it names its replica itself.
        return JSONResponse(body, status_code=500, headers={REPLICA_HEADER: request.app.state.replica})


# ---------------------------------------------------------------------------------------------- routing


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


class Fallback:
    """What no route serves: the playground's files for GET and HEAD outside /v1; else 405 (with Allow) for
    a route called with another method, and 404 `not_found` for everything else. (A plain StaticFiles mount
    at `/` would answer every POST to an unknown route with its own 405.)"""

    def __init__(self, app: FastAPI, directory: Path) -> None:
        self.app = app
        self.files = StaticFiles(directory=directory, html=True) if directory.is_dir() else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api = scope["path"] == "/v1" or scope["path"].startswith("/v1/")
        if scope["method"] in ("GET", "HEAD") and not api and self.files is not None:
            await self.files(scope, receive, send)
            return
        allowed = [
            method
            for method in _METHODS
            if any(
                not isinstance(route, Mount) and route.matches({**scope, "method": method})[0] is Match.FULL
                for route in self.app.router.routes
            )
        ]
        if allowed:
            raise StarletteHTTPException(
                405,
                f"{scope['method']} is not allowed on {scope['path']}; use {' or '.join(allowed)}",
                headers={"Allow": ", ".join(allowed)},
            )
        raise StarletteHTTPException(404)


# ---------------------------------------------------------------------------------------------- middleware


class _BodyTooLarge(PayloadTooLarge):
    pass


class BodyLimit:
    """413 for a body over the limit, whether announced by Content-Length or streamed in chunks."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
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


class ConcurrencyLimit:
    """429 (with Retry-After) once `limit` API requests are in flight; streams count until they end."""

    def __init__(self, app: ASGIApp, limit: int, metrics: Metrics) -> None:
        self.app, self.limit, self.metrics = app, limit, metrics
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
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


class RequestMetrics:
    """Counts and times requests by route template and status (never by path: ids are not labels)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
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
