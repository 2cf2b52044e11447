"""Preloaded memories in Redis: their metadata, each owner's index of them, and their stored state.

Keys (under the configured prefix), a namespace of their own beside the sessions' (store.py):
    M:{id}      hash: the memory's metadata; expires with the memory (Redis TTL)
    Mi:{owner}  set: the owner's memory ids (pruned of expired ones when listed)
    Mv:{id}     hash: the memory's stored state, one version in the format of memory_lua.py, same TTL; it lists
                blocks `k:{block}` shared by reference with the sessions started from it

A memory never changes once read: its state is version 1 for its whole life. Sessions started from it list the
same blocks in their own versions, each listing counted in the block's references, so deleting the memory only
takes its own references away; a block goes when nothing lists it. Its lifetime follows Gemini's context caches:
it expires `ttl_seconds` after its creation, or after the update that last set a TTL, however often it is used.
"""

from __future__ import annotations

import builtins
import json
import math
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from ..errors import Unavailable
from . import memory_lua
from .store import BlocksMissing, MemoryWrite, StoredMemory, live_indexed, now

T = TypeVar("T")

ID_PREFIX = "mem_"

_CREATE = (
    memory_lua.FUNCTIONS
    + """
-- KEYS[1] M:{id}, KEYS[2] Mv:{id}, KEYS[3] Mi:{owner}. ARGV: ttl, id, n, n field/value pairs, block prefix,
-- summary, header, hidden, then block id/data pairs. {1} created, {-3, id} a listed block is not stored.
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
local at = 4 + 2 * n
local blocks = {}
for i = at + 4, #ARGV do table.insert(blocks, ARGV[i]) end
local missing = write_version(KEYS[2], ARGV[at], ttl, '1', ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], 1, blocks)
if missing then return {-3, missing} end
local fields = {}
for i = 1, 2 * n do fields[i] = ARGV[3 + i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('SADD', KEYS[3], ARGV[2])
return {1}
"""
)

_UPDATE = (
    memory_lua.FUNCTIONS
    + """
-- KEYS[1] M:{id}, KEYS[2] Mv:{id}. ARGV: owner, ttl, n, n field/value pairs, block prefix. Changes the metadata of
-- the owner's memory and sets its TTL, which its blocks then live at least as long as. 1 done, 0 no such memory.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local fields = {}
for i = 1, 2 * n do fields[i] = ARGV[3 + i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
local header = redis.call('HGET', KEYS[2], 'h:1')
if header then
    for _, block in ipairs(cjson.decode(header).blocks) do extend(ARGV[4 + 2 * n] .. block, ttl) end
end
return 1
"""
)

_DELETE = (
    memory_lua.FUNCTIONS
    + """
-- KEYS[1] M:{id}, KEYS[2] Mv:{id}, KEYS[3] Mi:{owner}. ARGV: owner, block prefix, id. 1 deleted, 0 no such memory.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
drop_memory(KEYS[2], ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], ARGV[3])
return 1
"""
)


def new_memory_id() -> str:
    """`mem_` and 32 URL-safe characters (~192 random bits): never taken for a session id, which has no prefix."""
    return ID_PREFIX + secrets.token_urlsafe(24)


def is_memory_id(value: str) -> bool:
    return value.startswith(ID_PREFIX)


@dataclass
class MemoryMeta:
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

    def to_redis(self) -> dict[str, str]:
        out = {}
        for key, value in asdict(self).items():
            if key == "metadata":
                out[key] = json.dumps(value)
            elif key == "name":
                out[key] = json.dumps(value)  # null and "" stay apart
            else:
                out[key] = str(value)
        return out

    @classmethod
    def from_redis(cls, raw: Mapping[Any, Any]) -> MemoryMeta:
        d = {_text(k): _text(v) for k, v in raw.items()}
        return cls(
            id=d["id"],
            owner=d["owner"],
            name=json.loads(d["name"]),
            created_at=float(d["created_at"]),
            updated_at=float(d["updated_at"]),
            expires_at=float(d["expires_at"]),
            tokens=int(d["tokens"]),
            bytes=int(d["bytes"]),
            mem_tokens=int(d["mem_tokens"]),
            mem_len=int(d["mem_len"]),
            model=d["model"],
            metadata=json.loads(d["metadata"]),
        )


class MemoryStore:
    def __init__(self, redis: aioredis.Redis, *, prefix: str = "txl:") -> None:
        self.redis = redis
        self.prefix = prefix
        self._create = redis.register_script(_CREATE)
        self._update = redis.register_script(_UPDATE)
        self._delete = redis.register_script(_DELETE)
        self._load = redis.register_script(memory_lua.LOAD)

    def _m(self, memory_id: str) -> str:
        return f"{self.prefix}M:{memory_id}"

    def _i(self, owner: str) -> str:
        return f"{self.prefix}Mi:{owner}"

    def _v(self, memory_id: str) -> str:
        return f"{self.prefix}Mv:{memory_id}"

    @property
    def block_prefix(self) -> str:
        """The sessions' block namespace: a memory's blocks are the very ones its sessions list."""
        return f"{self.prefix}k:"

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        try:
            return await make()
        except (RedisError, OSError) as exc:
            raise Unavailable("memory store (Redis) is unavailable; nothing was changed") from exc

    async def create(self, meta: MemoryMeta, write: MemoryWrite) -> None:
        """Registers a new memory and its stored state in one step. Raises BlocksMissing if `write` lists a block
        the store does not hold (nothing is written then)."""
        fields = meta.to_redis()
        args: list[Any] = [meta.ttl_left(), meta.id, len(fields)]
        for key, value in fields.items():
            args += [key, value]
        stored = write.stored
        args += [self.block_prefix, write.summary.to_json(), stored.header_json(), stored.hidden or b""]
        for block, data in stored.new_blocks.items():
            args += [block, data]
        keys = [self._m(meta.id), self._v(meta.id), self._i(meta.owner)]
        reply = await self._call(lambda: self._create(keys=keys, args=args))
        if int(reply[0]) == -3:
            raise BlocksMissing({_text(reply[1])})

    async def get(self, memory_id: str) -> MemoryMeta | None:
        raw = await self._call(lambda: self.redis.hgetall(self._m(memory_id)))
        return MemoryMeta.from_redis(raw) if raw else None

    async def update(self, meta: MemoryMeta) -> bool:
        """Writes `meta` (its expiry too) if the owner's memory still exists."""
        fields = meta.to_redis()
        args: list[Any] = [meta.owner, meta.ttl_left(), len(fields)]
        for key, value in fields.items():
            args += [key, value]
        args.append(self.block_prefix)
        keys = [self._m(meta.id), self._v(meta.id)]
        return bool(await self._call(lambda: self._update(keys=keys, args=args)))

    async def delete(self, owner: str, memory_id: str) -> bool:
        """Deletes the owner's memory and its references to its blocks (blocks its sessions list stay)."""
        keys = [self._m(memory_id), self._v(memory_id), self._i(owner)]
        args = [owner, self.block_prefix, memory_id]
        return bool(await self._call(lambda: self._delete(keys=keys, args=args)))

    async def list(self, owner: str) -> builtins.list[MemoryMeta]:
        """The owner's live memories, oldest first; ids of expired ones are pruned from the index."""
        rows = await live_indexed(self.redis, self._call, self._i(owner), self._m)
        return sorted((MemoryMeta.from_redis(raw) for raw in rows), key=lambda m: (m.created_at, m.id))

    async def count(self, owner: str) -> int:
        """The owner's memories, as the index lists them (may still count expired ones: `list` is exact)."""
        return int(await self._call(lambda: self.redis.scard(self._i(owner))))

    async def load(self, memory_id: str) -> StoredMemory | None:
        """The memory's stored state, read atomically; None if there is none. Raises BlocksMissing if a block it
        lists is gone."""
        reply = await self._call(lambda: self._load(keys=[self._v(memory_id)], args=[self.block_prefix, ""]))
        status = int(reply[0])
        if status == -2:
            raise BlocksMissing({_text(reply[1])})
        if status != 1:
            return None
        header = json.loads(reply[2])
        hidden = _bytes(reply[3]) or None
        return StoredMemory(int(_text(reply[1])), header, hidden, [_bytes(b) for b in reply[4:]], None, {})


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
