"""POST /v1/score: log-likelihood of a long document, as JSON or a `text/plain` body, optionally streamed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from ..shared.dependencies import AppSettings, Service, Stateless, Tenant
from ..shared.disconnect import WatchedRoute
from ..shared.error_shapes import ERROR_RESPONSES
from ..shared.event_stream import json_or_stream_post
from ..shared.limits import MAX_MEMORY_ID_CHARS
from . import serving
from .protocol import SCORE_BODY_DOC, ScoreResponse

router = APIRouter(tags=["scoring"], responses=ERROR_RESPONSES, route_class=WatchedRoute)


@json_or_stream_post(router, "/v1/score", ScoreResponse, openapi_extra=SCORE_BODY_DOC)
async def score(
    request: Request,
    tenant: Tenant,
    settings: AppSettings,
    stateless: Stateless,
    service: Service,
    token_logprobs: bool = Query(False, description="text/plain bodies: same as the JSON field"),
    stream: bool = Query(False, description="text/plain bodies: same as the JSON field"),
    memory: str | None = Query(
        None, max_length=MAX_MEMORY_ID_CHARS, description="text/plain bodies: same as the JSON field"
    ),
) -> Any:
    body = await serving.read(
        request, settings.max_body_bytes, token_logprobs=token_logprobs, stream=stream, memory=memory
    )
    return await serving.score(body, tenant, stateless, service)
