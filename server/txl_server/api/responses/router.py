"""OpenAI's Responses API: `POST /v1/responses` (streamed or not), `GET` and `DELETE /v1/responses/{id}`, and
`GET /v1/responses/{id}/input_items`. The official `openai` client's `client.responses` works unchanged:
`output_text`, `stream=True`, `retrieve`, `delete`, `input_items.list`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from ...sessions.responses import ResponseTurns
from ..shared.dependencies import AppSettings, MetricsDep, ModelId, Tenant
from ..shared.event_stream import json_or_stream_post
from ..shared.json_body import JsonBodyRoute
from ..shared.openai_errors import OPENAI_ERROR_RESPONSES
from . import serving
from .protocol import DeletedResponse, InputItemList, ResponseCreateRequest, ResponseObject

router = APIRouter(tags=["responses"], responses=OPENAI_ERROR_RESPONSES, route_class=JsonBodyRoute)

Turns = Annotated[ResponseTurns, Depends(serving.get_turns)]


@json_or_stream_post(router, "/v1/responses", ResponseObject)
async def create_response(
    body: ResponseCreateRequest,
    turns: Turns,
    tenant: Tenant,
    settings: AppSettings,
    model_id: ModelId,
    metrics: MetricsDep,
) -> Any:
    """A reply to `input`, continuing `previous_response_id`'s session from its version (only the new input is
    fed), or a new session."""
    return await serving.create_response(body, turns, tenant, settings, model_id, metrics)


@router.get("/v1/responses/{response_id}", response_model=ResponseObject)
async def get_response(response_id: str, turns: Turns, tenant: Tenant) -> Any:
    """A stored response (while its session keeps its version)."""
    return JSONResponse((await serving.find(turns, tenant, response_id)).response)


@router.delete("/v1/responses/{response_id}", response_model=DeletedResponse)
async def delete_response(response_id: str, turns: Turns, tenant: Tenant) -> DeletedResponse:
    """Forgets a stored response: it can no longer be retrieved or continued (the session stays)."""
    record = await serving.find(turns, tenant, response_id)
    await turns.store.delete(record)
    return DeletedResponse(id=record.id)


@router.get("/v1/responses/{response_id}/input_items", response_model=InputItemList)
async def list_input_items(
    response_id: str,
    turns: Turns,
    tenant: Tenant,
    after: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> InputItemList:
    """The input items of the response's own turn (a string input is one user message)."""
    record = await serving.find(turns, tenant, response_id)
    return serving.list_input_items(record, after, limit, order)
