"""OpenAI's Responses API: `POST /v1/responses` (streamed or not, in the background or not, in a conversation or
chained to a previous response), `GET` (polled, or streamed again after a sequence number) and
`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`, and `GET /v1/responses/{id}/input_items`. The
official `openai` client's `client.responses` works unchanged: `output_text`, `stream=True`, `background=True`,
`retrieve` (with `stream=True, starting_after=N`), `cancel`, `delete`, `input_items.list`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from ..shared.dependencies import AppSettings, MetricsDep, ModelId, Responses, Tenant
from ..shared.event_stream import json_or_events, json_or_stream_post
from ..shared.json_body import JsonBodyRoute
from ..shared.openai_errors import OPENAI_ERROR_RESPONSES
from . import serving
from .protocol import DeletedResponse, InputItemList, ResponseCreateRequest, ResponseObject

router = APIRouter(tags=["responses"], responses=OPENAI_ERROR_RESPONSES, route_class=JsonBodyRoute)

CANCEL_WAIT_SECONDS = 5.0


@json_or_stream_post(router, "/v1/responses", ResponseObject)
async def create_response(
    body: ResponseCreateRequest,
    responses: Responses,
    tenant: Tenant,
    settings: AppSettings,
    model_id: ModelId,
    metrics: MetricsDep,
) -> Any:
    """A reply to `input`, continuing `previous_response_id`'s session from its version (only the new input is
    fed), or `conversation`'s, or a new session; with `background`, answered at once as queued."""
    return await serving.create_response(
        body, responses, tenant=tenant, settings=settings, model_id=model_id, metrics=metrics
    )


@router.get(
    "/v1/responses/{response_id}",
    response_model=ResponseObject,
    responses=json_or_events(200, "JSON, or (a background response, with stream) its SSE events"),
)
async def get_response(
    response_id: str,
    responses: Responses,
    tenant: Tenant,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1, le=10**9)] = None,
) -> Any:
    """A response: a background one as it stands (with `stream`, its events after `starting_after`), or a
    stored one (while its session keeps its version)."""
    return await serving.retrieve(responses, tenant, response_id, stream, starting_after)


@router.post("/v1/responses/{response_id}/cancel", response_model=ResponseObject)
async def cancel_response(response_id: str, responses: Responses, tenant: Tenant) -> Any:
    """Cancels a background response: `cancelled`, nothing committed. One already finished is answered as it is."""
    return await serving.cancel(responses, tenant, response_id, CANCEL_WAIT_SECONDS)


@router.delete("/v1/responses/{response_id}", response_model=DeletedResponse)
async def delete_response(response_id: str, responses: Responses, tenant: Tenant) -> DeletedResponse:
    """Forgets a response: it can no longer be retrieved or continued (the session stays); a background one that
    runs is cancelled first."""
    return await serving.delete(responses, tenant, response_id, CANCEL_WAIT_SECONDS)


@router.get("/v1/responses/{response_id}/input_items", response_model=InputItemList)
async def list_input_items(
    response_id: str,
    responses: Responses,
    tenant: Tenant,
    after: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> InputItemList:
    """The input items of the response's own turn (a string input is one user message)."""
    record = await serving.find(responses.turns, tenant, response_id)
    return serving.list_input_items(record, after, limit, order)
