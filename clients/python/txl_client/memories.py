"""Preloaded memories: `client.memories` (sync) and `async_client.memories` (async), over their client's
transport.

A memory is a document the server has read once; sessions start from it for the cost of a table, whatever the
document's length, and continue exactly as if they had read it:

    memory = client.memories.create(open("manual.txt").read(), name="manual", on_progress=print)
    session = client.create_session(" Q: how do I reset it?\\nA:", memory=memory.id)
    print(client.generate(session.id, max_tokens=100, temperature=0).text)
"""

from __future__ import annotations

from typing import Any

from .calls import Call, compact, keyed_call, path_segment
from .endpoints import Endpoint
from .operations import Operation, ProgressCallback, json_answer, listed, no_answer, streamed
from .transport import AsyncTransport, Transport
from .types import Memory

UNSET: Any = object()  # an argument not given (None means "none" for a memory's name and metadata)


def memory_path(memory_id: str) -> str:
    return "/v1/memories/" + path_segment(memory_id, "memory")


# ---------------------------------------------------------------------------------------------- operations


def create(
    text: str,
    *,
    name: str | None = None,
    ttl_seconds: int | None = None,
    metadata: dict[str, Any] | None = None,
    on_progress: ProgressCallback | None = None,
    idempotency_key: str | None = None,
) -> Operation[Memory]:
    """Has the server read `text` into a new memory. `on_progress(tokens_done, tokens_total)` is called as
    it reads (the call then streams, and the client's timeout does not run out while progress arrives).
    The memory expires `ttl_seconds` after its creation (default: the server's session TTL). Keyed: a retry
    after a lost response returns the memory the first attempt made, never a second one."""
    body = {"text": text, **compact(name=name, ttl_seconds=ttl_seconds, metadata=metadata)}
    if on_progress is None:
        return json_answer(keyed_call("POST", "/v1/memories", body, idempotency_key), Memory.model_validate)
    call = keyed_call("POST", "/v1/memories", {**body, "stream": True}, idempotency_key)
    return streamed(call, Memory, on_progress)


def list_all() -> Operation[list[Memory]]:
    return json_answer(Call("GET", "/v1/memories"), listed(Memory))


def get(memory_id: str) -> Operation[Memory]:
    return json_answer(Call("GET", memory_path(memory_id)), Memory.model_validate)


def update(
    memory_id: str, *, ttl_seconds: int | None = None, name: Any = UNSET, metadata: Any = UNSET
) -> Operation[Memory]:
    """Changes what is given: a new expiry `ttl_seconds` from now, the name (None: none), the metadata."""
    given = {"ttl_seconds": ttl_seconds, "name": name, "metadata": metadata}
    body = {k: v for k, v in given.items() if v is not UNSET and not (k == "ttl_seconds" and v is None)}
    if not body:
        raise ValueError("give ttl_seconds, name or metadata to change")
    return json_answer(Call("PATCH", memory_path(memory_id), body), Memory.model_validate)


def delete(memory_id: str, *, idempotency_key: str | None = None) -> Operation[None]:
    """Deletes the memory; sessions started from it go on."""
    return Operation(keyed_call("DELETE", memory_path(memory_id), None, idempotency_key), no_answer)


# ---------------------------------------------------------------------------------------------- the APIs


class MemoryEndpoints:
    """Create, list, get, update and delete preloaded memories."""

    create = Endpoint(create)
    list = Endpoint(list_all)
    get = Endpoint(get)
    update = Endpoint(update)
    delete = Endpoint(delete)


class Memories(MemoryEndpoints):
    """`client.memories`: create, list, get, update and delete preloaded memories."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport


class AsyncMemories(MemoryEndpoints):
    """`async_client.memories`: see `Memories`; `on_progress` may be a plain function or a coroutine function."""

    def __init__(self, transport: AsyncTransport) -> None:
        self.transport = transport
