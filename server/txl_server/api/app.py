"""The FastAPI application: `create_app(settings)`.

The lifespan starts the runtime (model, worker, Redis, sessions) and always stops it; on SIGTERM/SIGINT the
requests are drained first (`api/shutdown.py`). Every error leaves with its HTTP status in its family's shape: the
server's `{"error": {"type", "message", "param"}}`, or OpenAI's on the OpenAI routes (`shared/openai_errors.py`);
internals are logged, never returned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..admission.slots import TenantSlots
from ..errors import ServiceError
from ..metrics import Metrics
from ..runtime import LoadedModel, Runtime
from ..settings import Settings
from ..telemetry.observer import TracedSessions
from ..telemetry.tracing import Tracing
from .chat.router import router as chat_router
from .completions.router import router as completions_router
from .conversations.router import router as conversations_router
from .fallback import Fallback
from .memories.router import router as memories_router
from .middleware import BodyLimit, BodyReader, RequestMetrics, RequestSlots, UnexpectedErrors
from .openapi_document import serve_document
from .replica import REPLICA_HEADER, ReplicaHeader, replica_name
from .request_ids import REQUEST_ID_HEADER, RequestIds, request_id_of
from .responses.router import router as responses_router
from .score.router import router as score_router
from .sessions.router import router as sessions_router
from .shared.auth import ApiKeys
from .shared.chat_template import served_settings
from .shared.disconnect import CLIENT_CLOSED_REQUEST, ClientGone
from .shared.error_shapes import INTERNAL_ERROR, error_response
from .shared.json_response import JSONResponse
from .shared.openai_errors import OpenAIErrors, error_body
from .shared.validation import validation_message, validation_status
from .shutdown import Shutdown, ShutdownGate
from .system.router import router as system_router
from .tokenizer.router import router as tokenizer_router

log = logging.getLogger("txl_server")
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def create_app(settings: Settings, *, loaded: LoadedModel | None = None) -> FastAPI:
    """The application; `loaded` is a model already loaded from `settings` (else the lifespan loads it)."""
    settings = served_settings(settings)  # the chat template in force: the operator's, else the model's own
    metrics = Metrics()
    shutdown = Shutdown(settings.shutdown_grace_seconds)
    tracing = Tracing.from_env(settings, instance=replica_name(settings))  # None: no traces asked for

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sessions = metrics if tracing is None else TracedSessions(metrics)
        runtime = Runtime(settings, worker_observer=metrics, session_observer=sessions, loaded=loaded)
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
            if tracing is not None:
                await tracing.close()

    # FastAPIOffline: FastAPI whose /docs and /redoc load Swagger UI and ReDoc from files installed with the
    # server (the fastapi-offline wheel), not from a CDN, so that the API docs work on an air-gapped host.
    app = FastAPIOffline(
        title="TXL Serve",
        version=__version__,
        description="Stateful Transformer-XL inference: sessions with cached segment memory, streaming, scoring, "
        "and an OpenAI-compatible completions API.",
        lifespan=lifespan,
        default_response_class=JSONResponse,  # compact, ending with a newline (shared/json_response.py)
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.shutdown = shutdown
    app.state.api_keys = ApiKeys.from_settings(settings)
    app.state.started_at = time.time()
    app.state.replica = replica_name(settings)
    for router in (
        sessions_router,
        memories_router,
        score_router,
        completions_router,
        chat_router,
        responses_router,
        conversations_router,
        system_router,
        tokenizer_router,
    ):
        app.include_router(router)
    serve_document(app, settings)
    _install_error_handlers(app)
    # Innermost first; metrics see every response, including the limits' 413 and 429.
    app.state.slots = request_slots(settings)  # the API's concurrency slots, per tenant
    app.add_middleware(RequestSlots, slots=app.state.slots, keys=app.state.api_keys, metrics=metrics)
    app.add_middleware(UnexpectedErrors)
    app.add_middleware(BodyReader, timeout=settings.body_timeout_seconds)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(ShutdownGate, shutdown=shutdown)
    # The errors of the OpenAI routes, the limits' included, in OpenAI's shape.
    app.add_middleware(OpenAIErrors)
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.add_middleware(ReplicaHeader, replica=app.state.replica)
    app.add_middleware(RequestIds, tracing=tracing)  # outermost: every answer has its X-Request-Id
    app.mount("/", Fallback(app, STATIC_DIR), name="playground")
    return app


def request_slots(settings: Settings) -> TenantSlots:
    """The API's concurrency slots: with API keys, the last eighth kept for keys below their fair share."""
    limit = settings.max_concurrent_requests
    reserve = max(1, limit // 8) if settings.has_api_keys and limit > 1 else 0
    return TenantSlots(limit, per_tenant=settings.max_concurrent_requests_per_tenant, reserve=reserve)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        message, param = validation_message(errors, request.headers.get("content-type"))
        body = {"error": {"type": "invalid_request", "message": message, "param": param}}
        return JSONResponse(body, status_code=validation_status(errors))

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
        # An error in the layers around UnexpectedErrors. Starlette sends this answer from outside every layer
        # (OpenAIErrors included): it takes its family's shape itself.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        body = error_body(request.url.path, 500, INTERNAL_ERROR)
        # ... and names its replica and its request id itself.
        headers = {
            REPLICA_HEADER: request.app.state.replica,
            REQUEST_ID_HEADER: request_id_of(request.scope) or "",
        }
        return JSONResponse(body, status_code=500, headers=headers)
