"""Preloaded memories: `/v1/memories` (sessions/memories.py). Read a document once; start sessions from it with
`POST /v1/sessions {"memory": id}`, or score and complete after it (`memory` in /v1/score and /v1/completions)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from ..errors import InvalidRequest, ServiceError
from ..sessions.memories import MAX_NAME_CHARS, MemoryService
from ..sessions.store.memories import MemoryMeta
from . import sse
from .common import (
    ERROR_RESPONSES,
    AppSettings,
    EventStream,
    ProgressThrottle,
    Service,
    Tenant,
    check_metadata,
    check_unicode,
    log_text,
    progress_event,
)
from .disconnect import WatchedRoute, watch_connection
from .idempotency import Idempotent, IdempotentCall

router = APIRouter(
    prefix="/v1/memories", tags=["memories"], responses=ERROR_RESPONSES, route_class=WatchedRoute
)


class MemoryCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Documents are limited by the body size (TXL_MAX_BODY_BYTES), as scoring's are: memories exist for long ones.
    text: str = Field(..., description="The document to read")
    name: str | None = Field(None, max_length=MAX_NAME_CHARS, description="Your label for it")
    ttl_seconds: int | None = Field(
        None, ge=1, description="Expires this long after creation (not extended by use); default as sessions"
    )
    metadata: dict[str, Any] | None = Field(None, description="Your own JSON, returned with the memory")
    stream: bool = Field(
        False, description="Stream progress events while the document is read, then the memory"
    )


class MemoryUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_seconds: int | None = Field(None, ge=1, description="Expires this long from now")
    name: str | None = Field(None, max_length=MAX_NAME_CHARS, description="A new label (null: none)")
    metadata: dict[str, Any] | None = Field(None, description="Replaces the metadata (null: none)")


class MemoryObject(BaseModel):
    id: str
    object: Literal["memory"] = "memory"
    name: str | None
    tokens: int = Field(..., description="Tokens the document became")
    bytes: int = Field(..., description="UTF-8 bytes of the document")
    mem_tokens: int = Field(..., description="Positions its memory holds: the same for any long document")
    mem_len: int
    model: str
    created_at: int
    updated_at: int
    expires_at: int
    metadata: dict[str, Any]

    @classmethod
    def of(cls, meta: MemoryMeta) -> MemoryObject:
        return cls(
            id=meta.id,
            name=meta.name,
            tokens=meta.tokens,
            bytes=meta.bytes,
            mem_tokens=meta.mem_tokens,
            mem_len=meta.mem_len,
            model=meta.model,
            created_at=int(meta.created_at),
            updated_at=int(meta.updated_at),
            expires_at=math.ceil(meta.expires_at),
            metadata=meta.metadata,
        )


class MemoryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[MemoryObject] = Field(..., description="Oldest first")


@router.post(
    "",
    status_code=201,
    response_model=MemoryObject,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "With stream: progress events, then the memory",
        }
    },
)
@watch_connection
async def create_memory(
    body: MemoryCreate, service: Service, tenant: Tenant, settings: AppSettings, idempotent: Idempotent
) -> Any:
    """Reads `text` into a memory. It counts against the caller's memory limit and the device budget."""
    if not body.text:
        raise InvalidRequest("text must not be empty", param="text")
    check_unicode(body.text, "text")
    if body.name is not None:
        check_unicode(body.name, "name")
    check_metadata(settings, body.metadata)
    log_text(settings, "new memory", body.text)
    memories = service.memories
    if body.stream:
        if (stored := await idempotent.replay()) is not None:
            return EventStream(_replayed(stored))
        return EventStream(_progress_stream(memories, tenant, body, idempotent))

    async def create() -> dict[str, Any]:
        meta = await memories.create(
            tenant, body.text, name=body.name, ttl_seconds=body.ttl_seconds, metadata=body.metadata
        )
        return MemoryObject.of(meta).model_dump()

    return await idempotent.run(create)


@router.get("", response_model=MemoryList)
async def list_memories(service: Service, tenant: Tenant) -> MemoryList:
    return MemoryList(data=[MemoryObject.of(m) for m in await service.memories.list(tenant)])


@router.get("/{memory_id}", response_model=MemoryObject)
async def get_memory(memory_id: str, service: Service, tenant: Tenant) -> MemoryObject:
    return MemoryObject.of(await service.memories.get(tenant, memory_id))


@router.patch("/{memory_id}", response_model=MemoryObject)
async def update_memory(
    memory_id: str, body: MemoryUpdate, service: Service, tenant: Tenant, settings: AppSettings
) -> MemoryObject:
    """Changes what is given: a new expiry `ttl_seconds` from now, the name, the metadata."""
    given = body.model_fields_set
    if not given:
        raise InvalidRequest("give ttl_seconds, name or metadata to change", param="body")
    if "ttl_seconds" in given and body.ttl_seconds is None:
        raise InvalidRequest("ttl_seconds must be a number of seconds", param="ttl_seconds")
    changes: dict[str, Any] = {}
    if "name" in given:
        if body.name is not None:
            check_unicode(body.name, "name")
        changes["name"] = body.name
    if "metadata" in given:
        check_metadata(settings, body.metadata)
        changes["metadata"] = dict(body.metadata or {})
    meta = await service.memories.update(tenant, memory_id, ttl_seconds=body.ttl_seconds, changes=changes)
    return MemoryObject.of(meta)


@router.delete("/{memory_id}", status_code=204)
async def delete_memory(memory_id: str, service: Service, tenant: Tenant, idempotent: Idempotent) -> Response:
    """Deletes the memory. Sessions started from it go on: they hold its blocks too."""

    async def delete() -> dict[str, Any]:
        await service.memories.delete(tenant, memory_id)
        return {}

    await idempotent.run(delete)
    return Response(status_code=204)


async def _progress_stream(
    memories: MemoryService, tenant: str, body: MemoryCreate, call: IdempotentCall
) -> AsyncIterator[str]:
    """Progress events while the document is read, then `{"type": "result", ...the memory}`. A client that
    leaves cancels the reading: nothing is created."""
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    throttle = ProgressThrottle()

    def progress(done: int, total: int) -> None:
        if throttle.due(done, total):
            queue.put_nowait((done, total))

    task = asyncio.create_task(
        memories.create(
            tenant,
            body.text,
            name=body.name,
            ttl_seconds=body.ttl_seconds,
            metadata=body.metadata,
            progress=progress,
        )
    )
    finished = False
    getter: asyncio.Task[tuple[int, int]] | None = None
    try:
        while not task.done() or not queue.empty():
            getter = asyncio.create_task(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                done, total = getter.result()
                yield progress_event(done, total)
            else:
                getter.cancel()
        memory = MemoryObject.of(task.result()).model_dump()
        finished = True
        await call.succeeded(memory)
        yield sse.event({"type": "result", **memory})
    except ServiceError as exc:
        yield sse.event({"type": "error", **exc.body()})
    finally:
        # Shielded: when the client leaves, this runs inside a cancelled scope and must still stop the reading
        # and settle the Idempotency-Key.
        with anyio.CancelScope(shield=True):
            if getter is not None:
                getter.cancel()
            if not task.done():
                task.cancel()  # the client went away: stop reading (a commit under way still completes)
                with contextlib.suppress(BaseException):
                    await task
            if not finished:
                made = task.result() if not task.cancelled() and task.exception() is None else None
                if made is not None:  # created after all: a retry with the key gets it
                    await call.succeeded(MemoryObject.of(made).model_dump())
                else:
                    await call.failed()
    yield sse.DONE


async def _replayed(stored: dict[str, Any]) -> AsyncIterator[str]:
    yield sse.event({"type": "result", **stored})
    yield sse.DONE
