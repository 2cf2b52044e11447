"""Preloaded memories in Redis: their metadata, each owner's index of them, and their stored state.

Keys (plumbing.py), a namespace of their own beside the sessions': `M:{id}` the metadata, expiring with the memory;
`Mi:{owner}` the owner's memory ids (pruned of expired ones when listed); `Mv:{id}` its stored state, one version
in the format of a session's stored versions (versions.py), same TTL, listing blocks `k:{block}` shared by
reference with the sessions started from it.

A memory never changes once read: its state is version 1 for its whole life. Sessions started from it list the
same blocks in their own versions, each listing counted in the block's references, so deleting the memory only
takes its own references away; a block goes when nothing lists it. Its lifetime follows Gemini's context caches:
it expires `ttl_seconds` after its creation, or after the update that last set a TTL, however often it is used.
"""

from __future__ import annotations

import builtins
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from redis import asyncio as aioredis

from .plumbing import HashRecord, RedisStore, field_args, now
from .versions import LoadedVersion, VersionWrite, check_written, load_status, loaded

ID_PREFIX = "mem_"


def new_memory_id() -> str:
    """`mem_` and 32 URL-safe characters (~192 random bits): never taken for a session id, which has no prefix."""
    return ID_PREFIX + secrets.token_urlsafe(24)


@dataclass
class MemoryMeta(HashRecord):
    json_fields = frozenset({"name", "metadata"})  # a JSON name: null and "" stay apart

    id: str
    owner: str
    name: str | None
    created_at: float
    updated_at: float
    expires_at: float  # fixed: using the memory does not extend it (PATCH ttl_seconds does)
    tokens: int  # tokens the document became
    bytes: int  # UTF-8 bytes of the document
    mem_tokens: int  # positions its memory holds (at most its window's)
    mem_len: int
    model: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def ttl_left(self) -> int:
        """Seconds until it expires, for Redis (at least 1)."""
        return max(1, math.ceil(self.expires_at - now()))


class MemoryStore(RedisStore):
    name = "memory store (Redis)"

    def __init__(self, redis: aioredis.Redis, *, prefix: str = "txl:") -> None:
        super().__init__(redis, prefix=prefix)
        self._create = self.script("fields", "versions", "memory_create")
        self._update = self.script("fields", "versions", "memory_update")
        self._delete = self.script("versions", "memory_delete")
        self._load = self.script("load_version")

    async def create(self, meta: MemoryMeta, write: VersionWrite) -> None:
        """Registers a new memory and its stored state in one step. Raises BlocksMissing if `write` lists a block
        the store does not hold (nothing is written then)."""
        args: list[Any] = [
            meta.ttl_left(),
            meta.id,
            *field_args(meta.to_redis()),
            self.keys.blocks,
            *write.args(),
        ]
        keys = [
            self.keys.memory(meta.id),
            self.keys.memory_versions(meta.id),
            self.keys.owner_memories(meta.owner),
        ]
        check_written(await self.call(lambda: self._create(keys=keys, args=args)))

    async def get(self, memory_id: str) -> MemoryMeta | None:
        raw = await self.call(lambda: self.redis.hgetall(self.keys.memory(memory_id)))
        return MemoryMeta.from_redis(raw) if raw else None

    async def update(self, meta: MemoryMeta) -> bool:
        """Writes `meta` (its expiry too) if the owner's memory still exists."""
        args: list[Any] = [meta.owner, meta.ttl_left(), *field_args(meta.to_redis()), self.keys.blocks]
        keys = [self.keys.memory(meta.id), self.keys.memory_versions(meta.id)]
        return bool(await self.call(lambda: self._update(keys=keys, args=args)))

    async def delete(self, owner: str, memory_id: str) -> bool:
        """Deletes the owner's memory and its references to its blocks (blocks its sessions list stay)."""
        keys = [
            self.keys.memory(memory_id),
            self.keys.memory_versions(memory_id),
            self.keys.owner_memories(owner),
        ]
        args = [owner, self.keys.blocks, memory_id]
        return bool(await self.call(lambda: self._delete(keys=keys, args=args)))

    async def list(self, owner: str) -> builtins.list[MemoryMeta]:
        """The owner's live memories, oldest first; ids of expired ones are pruned from the index."""
        rows = await self.live_indexed(self.keys.owner_memories(owner), self.keys.memory)
        return sorted((MemoryMeta.from_redis(raw) for raw in rows), key=lambda m: (m.created_at, m.id))

    async def count(self, owner: str) -> int:
        """The owner's memories, as the index lists them (may still count expired ones: `list` is exact)."""
        return int(await self.call(lambda: self.redis.scard(self.keys.owner_memories(owner))))

    async def load(self, memory_id: str) -> LoadedVersion | None:
        """The memory's stored state, read atomically; None if there is none. Raises BlocksMissing if a block it
        lists is gone."""
        key = self.keys.memory_versions(memory_id)
        reply = await self.call(lambda: self._load(keys=[key], args=[self.keys.blocks, ""]))
        return loaded(reply) if load_status(reply) == 1 else None
