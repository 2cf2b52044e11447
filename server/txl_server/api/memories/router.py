"""Preloaded memories: `/v1/memories`. Read a document once; start sessions from it with
`POST /v1/sessions {"memory": id}`, or score and complete after it (`memory` in /v1/score and /v1/completions)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from ..shared.dependencies import AppSettings, Service, Tenant
from ..shared.disconnect import watch_connection
from ..shared.error_shapes import ERROR_RESPONSES
from ..shared.event_stream import json_or_events
from ..shared.idempotency import Idempotent
from ..shared.json_body import JsonBodyRoute
from . import serving
from .protocol import MemoryCreate, MemoryList, MemoryObject, MemoryUpdate

router = APIRouter(
    prefix="/v1/memories", tags=["memories"], responses=ERROR_RESPONSES, route_class=JsonBodyRoute
)


@router.post(
    "",
    status_code=201,
    response_model=MemoryObject,
    responses=json_or_events(200, "With stream: progress events, then the memory"),
)
@watch_connection
async def create_memory(
    body: MemoryCreate, service: Service, tenant: Tenant, settings: AppSettings, idempotent: Idempotent
) -> Any:
    """Reads `text` into a memory. It counts against the caller's memory limit and the device budget."""
    return await serving.create(service.memories, tenant, settings, idempotent, body)


@router.get("", response_model=MemoryList)
async def list_memories(service: Service, tenant: Tenant) -> MemoryList:
    return MemoryList(data=[MemoryObject.model_validate(m) for m in await service.memories.list(tenant)])


@router.get("/{memory_id}", response_model=MemoryObject)
async def get_memory(memory_id: str, service: Service, tenant: Tenant) -> MemoryObject:
    return MemoryObject.model_validate(await service.memories.get(tenant, memory_id))


@router.patch("/{memory_id}", response_model=MemoryObject)
async def update_memory(
    memory_id: str, body: MemoryUpdate, service: Service, tenant: Tenant, settings: AppSettings
) -> MemoryObject:
    """Changes what is given: a new expiry `ttl_seconds` from now, the name, the metadata."""
    return await serving.update(service.memories, tenant, settings, memory_id, body)


@router.delete("/{memory_id}", status_code=204)
async def delete_memory(memory_id: str, service: Service, tenant: Tenant, idempotent: Idempotent) -> Response:
    """Deletes the memory. Sessions started from it go on: they hold its blocks too."""
    await idempotent.run_unanswered(lambda: service.memories.delete(tenant, memory_id))
    return Response(status_code=204)
