"""What the memories routes do (sessions/memories.py): read a document once into a memory (as one JSON answer, or
a stream of progress while it is read), and change one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio

from ...errors import InvalidRequest
from ...sessions.idempotency import IdempotentCall
from ...sessions.memories import MemoryService
from ...settings import Settings
from ..shared import sse
from ..shared.event_stream import EventStream
from ..shared.limits import check_metadata, check_unicode
from ..shared.progress import ProgressThrottle, progress_event, replayed_result
from ..shared.text_log import log_text
from .protocol import MemoryCreate, MemoryObject, MemoryUpdate


async def create(
    memories: MemoryService, tenant: str, settings: Settings, idempotent: IdempotentCall, body: MemoryCreate
) -> Any:
    check_unicode(body.text, "text")
    if body.name is not None:
        check_unicode(body.name, "name")
    check_metadata(settings, body.metadata)
    log_text(settings, "new memory", body.text)
    if body.stream:
        if (stored := await idempotent.replay()) is not None:
            return EventStream(replayed_result(stored))
        return EventStream(_progress_stream(memories, tenant, body, idempotent))

    async def work() -> dict[str, Any]:
        meta = await memories.create(
            tenant, body.text, name=body.name, ttl_seconds=body.ttl_seconds, metadata=body.metadata
        )
        return MemoryObject.model_validate(meta).model_dump()

    return await idempotent.run(work)


async def update(
    memories: MemoryService, tenant: str, settings: Settings, memory_id: str, body: MemoryUpdate
) -> MemoryObject:
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
    meta = await memories.update(tenant, memory_id, ttl_seconds=body.ttl_seconds, changes=changes)
    return MemoryObject.model_validate(meta)


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
        memory = MemoryObject.model_validate(task.result()).model_dump()
        finished = True
        await call.succeeded(memory)
        yield sse.event({"type": "result", **memory})
        yield sse.DONE
    finally:  # an error ends the stream with its error event, then [DONE] (EventStream)
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
                error = None if task.cancelled() else task.exception()
                made = task.result() if not task.cancelled() and error is None else None
                if made is not None:  # created after all: a retry with the key gets it
                    await call.succeeded(MemoryObject.model_validate(made).model_dump())
                else:
                    await call.failed(error)
