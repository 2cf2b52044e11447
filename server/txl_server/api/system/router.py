"""Liveness, readiness, what serves (`/v1/system`) and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..shared.chat_template import ChatTemplateInfo
from ..shared.dependencies import ModelId, Tenant
from ..shared.error_shapes import ERROR_RESPONSES, ErrorBody
from . import serving
from .protocol import SystemInfo

router = APIRouter(tags=["system"])


@router.get(
    "/health",
    responses={
        503: {
            "model": ErrorBody,
            "description": "Not alive: the device failed, or the worker made no progress with work waiting",
        }
    },
)
async def health(request: Request) -> dict[str, str]:
    """Liveness: the process serves HTTP, its device works and its worker makes progress (a failure means
    restart it; while the model loads it is alive). `/ready` says whether to send it traffic."""
    return serving.health(request.app.state.runtime)


@router.get(
    "/ready",
    responses={
        503: {
            "model": ErrorBody,
            "description": "Not ready: model not loaded, Redis unreachable, device failed",
        }
    },
)
async def ready(request: Request) -> Response:
    """Ready to take traffic: the model is loaded and checked on its device, the device works, Redis answers.
    The body says what serves (device, dtype, attention kernel, CUDA graphs)."""
    return await serving.ready(request.app.state.runtime)


@router.get("/v1/system", response_model=SystemInfo, responses=ERROR_RESPONSES)
async def system(request: Request, tenant: Tenant, model_id: ModelId) -> SystemInfo:
    """The device and how it serves: dtype, the attention kernel, CUDA graphs (and why not), the memory pool,
    the window grid; what the start-up checks turned off says why; the chat template in force."""
    state = request.app.state
    return serving.system_info(state.runtime, model_id, ChatTemplateInfo.of(state.settings))


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    app_metrics = request.app.state.metrics
    serving.update_gauges(app_metrics, request.app.state.runtime)
    return Response(generate_latest(app_metrics.registry), media_type=CONTENT_TYPE_LATEST)
