"""Liveness, readiness, what serves (`/v1/system`) and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import __version__
from ..errors import Unavailable
from .common import ERROR_RESPONSES, ModelId, Tenant
from .system_protocol import ReadyInfo, ServingInfo, SystemInfo

router = APIRouter(tags=["system"])


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive and serving HTTP."""
    return {"status": "ok"}


@router.get(
    "/ready",
    responses={503: {"description": "Not ready: model not loaded, Redis unreachable, device failed"}},
)
async def ready(request: Request) -> Response:
    """Ready to take traffic: the model is loaded and checked on its device, the device works, Redis answers.
    The body says what serves (device, dtype, attention kernel, CUDA graphs)."""
    runtime = request.app.state.runtime
    if await runtime.ready():
        report = runtime.device_report()
        serving = ReadyInfo(
            device=report.device,
            dtype=report.dtype,
            attention=report.attention,
            cuda_graphs=report.cuda_graphs,
        )
        return JSONResponse({"status": "ready", "model": runtime.model_id, **serving.model_dump()})
    failed = runtime.worker is not None and runtime.worker.device_error is not None
    message = (
        "not ready: the device failed; restart the server"
        if failed
        else "not ready: model or Redis unavailable"
    )
    body = {"error": {"type": "unavailable", "message": message, "param": None}}
    return JSONResponse(body, status_code=503)


@router.get("/v1/system", response_model=SystemInfo, responses=ERROR_RESPONSES)
async def system(request: Request, tenant: Tenant, model_id: ModelId) -> SystemInfo:
    """The device and how it serves: dtype, the attention kernel, CUDA graphs (and why not), the memory pool,
    the window grid; what the start-up checks turned off says why."""
    report = request.app.state.runtime.device_report()
    if report is None:
        raise Unavailable("the server is starting")
    return SystemInfo(model=model_id, version=__version__, serving=ServingInfo.of(report))


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    app_metrics = request.app.state.metrics
    service = request.app.state.runtime.service
    if service is not None:
        for tier in ("device", "host"):
            app_metrics.sessions.labels(tier).set(service.cache.count(tier))
            app_metrics.memory_bytes.labels(tier).set(service.cache.used(tier))
            app_metrics.memory_budget.labels(tier).set(service.cache.budget(tier))
    return Response(generate_latest(app_metrics.registry), media_type=CONTENT_TYPE_LATEST)
