"""Session routes: create, list, get, delete, fork, snapshots, append, generate (JSON or SSE); and the history's:
the versions a session keeps, and going back to one (sessions/history.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from starlette.routing import Match
from starlette.types import Scope

from ..shared.dependencies import AppSettings, MetricsDep, Service, Tenant
from ..shared.error_shapes import ERROR_RESPONSES
from ..shared.event_stream import json_or_stream_post
from ..shared.idempotency import Idempotent
from ..shared.json_body import JsonBodyRoute
from ..shared.limits import TtlSeconds
from . import serving
from .protocol import (
    STREAM_DESCRIPTION,
    AppendRequest,
    AppendResponse,
    GenerateRequest,
    GenerateResponse,
    RewindRequest,
    RewindResponse,
    SessionCreate,
    SessionFork,
    SessionList,
    SessionObject,
    VersionList,
    VersionObject,
)

IMPORT_PATH = "/v1/sessions/import"


class SessionRoute(JsonBodyRoute):
    """`/v1/sessions/import` is the import route's alone: the session's own route (`/v1/sessions/{session_id}`)
    does not take `import` for an id (no session has it), so the other methods there are 405 with
    `Allow: POST`, not a search for a session called "import"."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE and self.path.endswith("/{session_id}") and scope["path"] == IMPORT_PATH:
            return Match.NONE, {}
        return match, child


router = APIRouter(
    prefix="/v1/sessions", tags=["sessions"], responses=ERROR_RESPONSES, route_class=SessionRoute
)


# ---------------------------------------------------------------------------------------------- lifecycle


@json_or_stream_post(router, "", SessionObject, status_code=201)
async def create_session(
    service: Service,
    tenant: Tenant,
    settings: AppSettings,
    idempotent: Idempotent,
    body: SessionCreate | None = None,
) -> Any:
    """A new session, primed with `text` (after a preloaded memory's document, with `memory`). The body may be
    omitted (an empty session with the defaults)."""
    return await serving.create(service, tenant, settings, idempotent, body or SessionCreate())


@router.get("", response_model=SessionList)
async def list_sessions(service: Service, tenant: Tenant) -> SessionList:
    return SessionList(data=[SessionObject.model_validate(m) for m in await service.list_sessions(tenant)])


@router.get("/{session_id}", response_model=SessionObject)
async def get_session(session_id: str, service: Service, tenant: Tenant) -> SessionObject:
    return SessionObject.model_validate(await service.get(tenant, session_id))


@router.delete("/{session_id}", status_code=204)
async def delete_session(
    session_id: str, service: Service, tenant: Tenant, idempotent: Idempotent
) -> Response:
    await serving.delete(service, tenant, idempotent, session_id)
    return Response(status_code=204)


@router.post("/{session_id}/fork", status_code=201, response_model=SessionObject)
async def fork_session(
    session_id: str,
    service: Service,
    tenant: Tenant,
    settings: AppSettings,
    idempotent: Idempotent,
    body: SessionFork | None = None,
) -> Any:
    return await serving.fork(service, tenant, settings, idempotent, session_id, body)


# ---------------------------------------------------------------------------------------------- snapshots


@router.get(
    "/{session_id}/snapshot",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "A safetensors blob"}},
)
async def export_snapshot(session_id: str, service: Service, tenant: Tenant) -> Response:
    """The session's memory and metadata as one safetensors file, to import elsewhere."""
    data = await service.export_snapshot(tenant, session_id)
    headers = serving.snapshot_headers(session_id)
    return Response(data, media_type="application/octet-stream", headers=headers)


@json_or_stream_post(
    router,
    "/import",
    SessionObject,
    status_code=201,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def import_snapshot(
    request: Request,
    service: Service,
    tenant: Tenant,
    idempotent: Idempotent,
    ttl_seconds: Annotated[
        TtlSeconds | None, Query(description="Expires this long after its last use")
    ] = None,
    stream: bool = Query(False, description=STREAM_DESCRIPTION),
) -> Any:
    """A new session (new id, owned by the caller) from a snapshot exported by any TXL Serve of this model."""
    data = await request.body()
    return await serving.import_snapshot(
        service, tenant, idempotent, data, ttl_seconds=ttl_seconds, stream=stream
    )


# ---------------------------------------------------------------------------------------------- steps


@json_or_stream_post(router, "/{session_id}/append", AppendResponse)
async def append(
    session_id: str,
    body: AppendRequest,
    service: Service,
    tenant: Tenant,
    settings: AppSettings,
    idempotent: Idempotent,
) -> Any:
    return await serving.append(service, tenant, settings, idempotent, session_id, body)


@json_or_stream_post(
    router, "/{session_id}/generate", GenerateResponse, "JSON, or SSE events with stream=true"
)
async def generate(
    session_id: str,
    body: GenerateRequest,
    service: Service,
    tenant: Tenant,
    settings: AppSettings,
    idempotent: Idempotent,
    metrics: MetricsDep,
) -> Any:
    return await serving.generate(service, tenant, settings, idempotent, metrics, session_id, body)


# ---------------------------------------------------------------------------------------------- history


@router.get("/{session_id}/versions", response_model=VersionList)
async def list_versions(session_id: str, service: Service, tenant: Tenant) -> VersionList:
    """The versions the session keeps (TXL_KEEP_VERSIONS), newest first."""
    return VersionList(
        data=[VersionObject.model_validate(v) for v in await service.history.versions(tenant, session_id)]
    )


@router.post("/{session_id}/rewind", response_model=RewindResponse)
async def rewind(
    session_id: str, body: RewindRequest, service: Service, tenant: Tenant, idempotent: Idempotent
) -> Any:
    """The session continues from a kept version's memory. The rewind is itself a step: a new, higher version
    (history is never lost; another rewind undoes it). A version no longer kept: 404 `version_not_found`."""
    return await serving.rewind(service, tenant, idempotent, session_id, body.version)
