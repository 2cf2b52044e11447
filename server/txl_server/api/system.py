"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["system"])


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive and serving HTTP."""
    return {"status": "ok"}


@router.get("/ready", responses={503: {"description": "Not ready: model not loaded or Redis unreachable"}})
async def ready(request: Request) -> Response:
    """Ready to take traffic: the model is loaded and Redis answers."""
    runtime = request.app.state.runtime
    if await runtime.ready():
        return JSONResponse({"status": "ready", "model": runtime.model_id})
    body = {
        "error": {"type": "unavailable", "message": "not ready: model or Redis unavailable", "param": None}
    }
    return JSONResponse(body, status_code=503)


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
