"""`POST /v1/completions`, `GET /v1/models` and `GET /v1/models/{model}`, usable by the official `openai` client."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ..shared.dependencies import ModelId, Tenant
from ..shared.event_stream import json_or_stream_post
from ..shared.json_body import JsonBodyRoute
from ..shared.openai_errors import OPENAI_ERROR_RESPONSES
from . import serving
from .protocol import Completion, CompletionRequest, ModelCard, ModelList
from .sources import CompletionSources

router = APIRouter(tags=["openai"], responses=OPENAI_ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request, tenant: Tenant, model_id: ModelId) -> ModelList:
    state = request.app.state
    return serving.list_models(state.runtime.device_report(), model_id, state.started_at, state.settings)


@router.get("/v1/models/{model}", response_model=ModelCard)
async def retrieve_model(model: str, request: Request, tenant: Tenant, model_id: ModelId) -> ModelCard:
    """The served model (OpenAI's model object); any other: 404 `model_not_found`."""
    state = request.app.state
    report = state.runtime.device_report()
    return serving.retrieve_model(model, report, model_id, state.started_at, state.settings)


@json_or_stream_post(router, "/v1/completions", Completion, "JSON, or SSE chunks with stream")
async def create_completion(body: CompletionRequest, sources: CompletionSources) -> Any:
    return await serving.create_completion(body, sources)
