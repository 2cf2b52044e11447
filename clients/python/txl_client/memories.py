"""Preloaded memories: `client.memories` (sync) and `async_client.memories` (async).

A memory is a document the server has read once; sessions start from it for the cost of a table, whatever the
document's length, and continue exactly as if they had read it:

    memory = client.memories.create(open("manual.txt").read(), name="manual", on_progress=print)
    session = client.create_session(" Q: how do I reset it?\\nA:", memory=memory.id)
    print(client.generate(session.id, max_tokens=100, temperature=0).text)
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import Field

from . import _core
from .errors import TxlConnectionError
from .types import Progress, _Model

if TYPE_CHECKING:
    from .async_client import AsyncClient
    from .client import Client

ProgressCallback = Callable[[int, int], object]
AsyncProgressCallback = Callable[[int, int], object | Awaitable[object]]


class Memory(_Model):
    id: str  # "mem_..."
    object: Literal["memory"] = "memory"
    name: str | None = None
    tokens: int  # tokens the document became
    bytes: int  # UTF-8 bytes of the document
    mem_tokens: int  # positions its memory holds (the same for any long document)
    mem_len: int
    model: str
    created_at: int
    updated_at: int
    expires_at: int  # fixed: using the memory does not extend it (update(ttl_seconds=...) does)
    metadata: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- requests


def _path(memory_id: str) -> str:
    if not memory_id or "/" in memory_id or memory_id in (".", ".."):
        raise ValueError(f"not a memory id: {memory_id!r}")
    return f"/v1/memories/{memory_id}"


def create_call(
    text: str,
    name: str | None,
    ttl_seconds: int | None,
    metadata: dict[str, Any] | None,
    stream: bool,
    idempotency_key: str | None,
) -> _core.Call:
    """Keyed: a retry after a lost response returns the memory the first attempt made, never a second one."""
    body: dict[str, Any] = {"text": text}
    given = (("name", name), ("ttl_seconds", ttl_seconds), ("metadata", metadata))
    body.update({k: v for k, v in given if v is not None})
    if stream:
        body["stream"] = True
    return _core.Call(
        "POST", "/v1/memories", body, idempotency_key=idempotency_key or _core.new_idempotency_key()
    )


_UNSET: Any = object()


def update_call(memory_id: str, ttl_seconds: int | None, name: Any, metadata: Any) -> _core.Call:
    body: dict[str, Any] = {}
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    if name is not _UNSET:
        body["name"] = name
    if metadata is not _UNSET:
        body["metadata"] = metadata
    if not body:
        raise ValueError("give ttl_seconds, name or metadata to change")
    return _core.Call("PATCH", _path(memory_id), body)


def delete_call(memory_id: str, idempotency_key: str | None) -> _core.Call:
    return _core.Call(
        "DELETE", _path(memory_id), idempotency_key=idempotency_key or _core.new_idempotency_key()
    )


def create_event(event: dict[str, Any]) -> Progress | Memory | None:
    kind = event.get("type")
    if kind == "progress":
        return Progress.model_validate(event)
    if kind == "result":
        return Memory.model_validate({k: v for k, v in event.items() if k != "type"})
    return None


# ---------------------------------------------------------------------------------------------- sync


class Memories:
    """`client.memories`: create, list, get, update and delete preloaded memories."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self,
        text: str,
        *,
        name: str | None = None,
        ttl_seconds: int | None = None,
        metadata: dict[str, Any] | None = None,
        on_progress: ProgressCallback | None = None,
        idempotency_key: str | None = None,
    ) -> Memory:
        """Has the server read `text` into a new memory. `on_progress(tokens_done, tokens_total)` is called as
        it reads (the call then streams, and the client's timeout does not run out while progress arrives).
        The memory expires `ttl_seconds` after its creation (default: the server's session TTL)."""
        stream = on_progress is not None
        call = create_call(text, name, ttl_seconds, metadata, stream, idempotency_key)
        if not stream:
            return Memory.model_validate(self._client._json(call))
        from .client import _events

        attempt, lost = 0, None
        while True:
            response = self._client._send(call, stream=True, lost=lost)
            try:
                for event in _events(response, create_event):
                    if isinstance(event, Progress) and on_progress is not None:
                        on_progress(event.tokens_done, event.tokens_total)
                    elif isinstance(event, Memory):
                        return event
                raise _core.ended_early("memory")
            except TxlConnectionError as error:  # keyed: the retry gets the first attempt's memory
                delay = _core.retry_delay(
                    self._client._options, call, error, attempt=attempt, after_lost_response=True
                )
                if delay is None:
                    raise
                time.sleep(delay)
                attempt, lost = attempt + 1, error
            finally:
                response.close()

    def list(self) -> builtins.list[Memory]:
        body = self._client._json(_core.Call("GET", "/v1/memories"))
        return [Memory.model_validate(m) for m in body["data"]]

    def get(self, memory_id: str) -> Memory:
        return Memory.model_validate(self._client._json(_core.Call("GET", _path(memory_id))))

    def update(
        self, memory_id: str, *, ttl_seconds: int | None = None, name: Any = _UNSET, metadata: Any = _UNSET
    ) -> Memory:
        """Changes what is given: a new expiry `ttl_seconds` from now, the name (None: none), the metadata."""
        return Memory.model_validate(self._client._json(update_call(memory_id, ttl_seconds, name, metadata)))

    def delete(self, memory_id: str, *, idempotency_key: str | None = None) -> None:
        """Deletes the memory; sessions started from it go on."""
        self._client._send(delete_call(memory_id, idempotency_key)).close()


# ---------------------------------------------------------------------------------------------- async


class AsyncMemories:
    """`async_client.memories`: see `Memories`; `on_progress` may be a plain function or a coroutine function."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        text: str,
        *,
        name: str | None = None,
        ttl_seconds: int | None = None,
        metadata: dict[str, Any] | None = None,
        on_progress: AsyncProgressCallback | None = None,
        idempotency_key: str | None = None,
    ) -> Memory:
        stream = on_progress is not None
        call = create_call(text, name, ttl_seconds, metadata, stream, idempotency_key)
        if not stream:
            return Memory.model_validate(await self._client._json(call))
        from .async_client import _events

        attempt, lost = 0, None
        while True:
            response: httpx.Response = await self._client._send(call, stream=True, lost=lost)
            try:
                async for event in _events(response, create_event):
                    if isinstance(event, Progress) and on_progress is not None:
                        result = on_progress(event.tokens_done, event.tokens_total)
                        if asyncio.iscoroutine(result):
                            await result
                    elif isinstance(event, Memory):
                        return event
                raise _core.ended_early("memory")
            except TxlConnectionError as error:
                delay = _core.retry_delay(
                    self._client._options, call, error, attempt=attempt, after_lost_response=True
                )
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                attempt, lost = attempt + 1, error
            finally:
                await response.aclose()

    async def list(self) -> builtins.list[Memory]:
        body = await self._client._json(_core.Call("GET", "/v1/memories"))
        return [Memory.model_validate(m) for m in body["data"]]

    async def get(self, memory_id: str) -> Memory:
        return Memory.model_validate(await self._client._json(_core.Call("GET", _path(memory_id))))

    async def update(
        self, memory_id: str, *, ttl_seconds: int | None = None, name: Any = _UNSET, metadata: Any = _UNSET
    ) -> Memory:
        return Memory.model_validate(
            await self._client._json(update_call(memory_id, ttl_seconds, name, metadata))
        )

    async def delete(self, memory_id: str, *, idempotency_key: str | None = None) -> None:
        await (await self._client._send(delete_call(memory_id, idempotency_key))).aclose()
