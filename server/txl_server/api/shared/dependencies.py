"""What a route takes from the application: its services (built once at start-up by the runtime: runtime.py),
settings and metrics, and the caller's tenant.

Each is `async def`: FastAPI runs a plain `def` dependency in its thread pool, a hop of the event loop and a
thread for every one of them on every request (dozens per request, a third of what a refused request cost)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from ...metrics import Metrics
from ...sessions.conversations import ConversationService
from ...sessions.responses_services import ResponsesServices
from ...sessions.service import SessionService
from ...sessions.stateless import StatelessService
from ...settings import Settings
from ...telemetry.context import bind_tenant


async def get_service(request: Request) -> SessionService:
    service = request.app.state.runtime.service
    assert service is not None
    return service


async def get_stateless(request: Request) -> StatelessService:
    stateless = request.app.state.runtime.stateless
    assert stateless is not None
    return stateless


async def get_responses(request: Request) -> ResponsesServices:
    responses = request.app.state.runtime.responses
    assert responses is not None
    return responses


async def get_conversations(
    responses: Annotated[ResponsesServices, Depends(get_responses)],
) -> ConversationService:
    return responses.conversations


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def get_model_id(request: Request) -> str:
    model_id: str = request.app.state.runtime.model_id
    return model_id


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


# The OpenAPI document's security scheme: `Authorization: Bearer <key>`. The key is checked by `get_tenant` (a
# missing or wrong one is a 401 in the route's error shape), not by FastAPI's own HTTPBearer answer.
API_KEY = HTTPBearer(
    scheme_name="ApiKey",
    description="An API key, when the server has keys configured (TXL_API_KEYS): each key is a tenant",
    auto_error=False,
)


async def get_tenant(request: Request, _: Annotated[object, Depends(API_KEY)] = None) -> str:
    tenant: str = request.app.state.api_keys.tenant(request.headers.get("authorization"))
    bind_tenant(tenant)  # the request's log lines and span name it
    return tenant


Service = Annotated[SessionService, Depends(get_service)]
Stateless = Annotated[StatelessService, Depends(get_stateless)]
Responses = Annotated[ResponsesServices, Depends(get_responses)]
Conversations = Annotated[ConversationService, Depends(get_conversations)]
ModelId = Annotated[str, Depends(get_model_id)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
Tenant = Annotated[str, Depends(get_tenant)]
AppSettings = Annotated[Settings, Depends(get_settings)]
