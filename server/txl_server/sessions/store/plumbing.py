"""What every Redis store shares: one connection under one key prefix, the table of keys, errors, Lua scripts.

Every key the server writes, under the configured prefix (`Keys` names each one; no store spells a key itself, so
that two ideas never share a key by accident):
    s:{id}          hash: a session's metadata; expires with the session (sessions.py)
    t:{owner}       set: the owner's session ids (pruned of expired ones when listed)
    m:{id}          hash: a session's stored versions, each a header listing its blocks (lua/versions.lua)
    k:{block}       hash: one block's references, shared by every version, fork, session and memory listing it
                    (its bytes in the block store: sessions/blocks/)
    l:{id}          string: the session's single-writer lease ("{replica}/{random}"), expires by itself (leases.py)
    d:{id}          string: a deleted session's mark, as long as it would have lived (a 404 then, not a loss)
    i:{owner}:{key} string: a request's first result under an Idempotency-Key (idempotency.py)
    r:{name}        string: a live replica's heartbeat (its incarnation), expires unless renewed (heartbeats.py)
    r:{session}     hash: the session's stored responses (responses.py; a session id has no ':', a replica name has)
    c:{session}     hash: the conversation on a session, and ci:{session}, a list: its items (conversations.py)
    cl:{session}    string: the conversation's turn lock ("{replica}/{random}"), expires by itself
    b:{response}    hash: a background response's job, and be:{response}, a list: its events (jobs.py)
    store           hash: the store's identity: its id and how many commits it ever made (redis_health.py)
    sweep           string: the block sweeper's lock (one replica sweeps at a time: sessions/blocks/sweeper.py)
    M:{id}          hash: a preloaded memory's metadata (memories.py)
    Mi:{owner}      set: the owner's memory ids
    Mv:{id}         hash: a preloaded memory's stored state, one version in the format of m:{id}

The rule: a store reaches Redis only through `RedisStore.call`, so that any failure to reach it surfaces as
`Unavailable` with its cause ("nothing was changed" only where that is known: failures.py), never as a Redis
error in a route. Whatever must change together is one
Lua script (`lua/*.lua`, read once per process, registered once per store): Redis runs a script atomically.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar, get_type_hints

from redis import asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from .failures import failure

T = TypeVar("T")


def now() -> float:
    """The wall-clock time stored in metadata (seconds since the epoch): every replica reads it alike."""
    return time.time()


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def field_args(fields: Mapping[Any, Any]) -> list[Any]:
    """A hash's fields as the scripts take them: how many, then each field and its value."""
    return [len(fields), *(item for pair in fields.items() for item in pair)]


def glob_escape(value: str) -> str:
    """`value` matched literally in a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


class HashRecord:
    """A dataclass kept as a Redis hash: each field as its text (`str(value)`), those named in `json_fields` as
    JSON; read back by each field's type. A field named in `later_fields` (older servers did not write it) takes
    its default where the hash lacks it; any other missing field is a KeyError."""

    json_fields: ClassVar[frozenset[str]] = frozenset()
    later_fields: ClassVar[frozenset[str]] = frozenset()

    def to_redis(self) -> dict[str, str]:
        assert dataclasses.is_dataclass(self)
        return {
            k: (json.dumps(v) if k in self.json_fields else str(v))
            for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_redis(cls, raw: Mapping[Any, Any]) -> Self:
        d = {text(k): text(v) for k, v in raw.items()}
        values: dict[str, Any] = {}
        for name, read in _readers(cls).items():
            if name in d:
                values[name] = json.loads(d[name]) if name in cls.json_fields else read(d[name])
            elif name not in cls.later_fields:
                raise KeyError(name)
        return cls(**values)


_READERS: dict[type, dict[str, Callable[[str], Any]]] = {}


def _readers(cls: type) -> dict[str, Callable[[str], Any]]:
    """How each field of a HashRecord is read from its text: by its type (int, float, str; JSON fields aside)."""
    readers = _READERS.get(cls)
    if readers is None:
        hints = get_type_hints(cls)
        fields = dataclasses.fields(cls)
        readers = _READERS[cls] = {
            f.name: hints[f.name] if hints[f.name] in (int, float) else str for f in fields
        }
    return readers


@cache
def lua(name: str) -> str:
    """The source of `lua/{name}.lua` (package data), read once."""
    return (Path(__file__).with_name("lua") / f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Keys:
    prefix: str

    def session(self, session_id: str) -> str:
        return f"{self.prefix}s:{session_id}"

    def owner_sessions(self, owner: str) -> str:
        return f"{self.prefix}t:{owner}"

    @property
    def owner_sessions_prefix(self) -> str:
        """What `owner_sessions` puts before the owner (a script that finds the owner itself appends it)."""
        return f"{self.prefix}t:"

    def versions(self, session_id: str) -> str:
        return f"{self.prefix}m:{session_id}"

    @property
    def blocks(self) -> str:
        """The prefix of every block's key (`k:{block}`), as the scripts take it."""
        return f"{self.prefix}k:"

    def lease(self, session_id: str) -> str:
        return f"{self.prefix}l:{session_id}"

    @property
    def store(self) -> str:
        return f"{self.prefix}store"

    @property
    def sweep_lock(self) -> str:
        return f"{self.prefix}sweep"

    def deleted(self, session_id: str) -> str:
        return f"{self.prefix}d:{session_id}"

    def idempotency(self, owner: str, key: str) -> str:
        return f"{self.prefix}i:{owner}:{key}"

    def heartbeat(self, name: str) -> str:
        return f"{self.prefix}r:{name}"

    def responses(self, session_id: str) -> str:
        return f"{self.prefix}r:{session_id}"

    def conversation(self, session_id: str) -> str:
        return f"{self.prefix}c:{session_id}"

    def conversation_items(self, session_id: str) -> str:
        return f"{self.prefix}ci:{session_id}"

    def conversation_lock(self, session_id: str) -> str:
        return f"{self.prefix}cl:{session_id}"

    def job(self, response_id: str) -> str:
        return f"{self.prefix}b:{response_id}"

    def job_events(self, response_id: str) -> str:
        return f"{self.prefix}be:{response_id}"

    def memory(self, memory_id: str) -> str:
        return f"{self.prefix}M:{memory_id}"

    def owner_memories(self, owner: str) -> str:
        return f"{self.prefix}Mi:{owner}"

    def memory_versions(self, memory_id: str) -> str:
        return f"{self.prefix}Mv:{memory_id}"

    def every(self, kind: str) -> str:
        """A MATCH pattern for every key of a kind ("s", "l", ...) under this prefix."""
        return f"{glob_escape(self.prefix)}{kind}:*"


class RedisStore:
    """One idea's keys in Redis, on the connection every store shares."""

    # What a route's error calls this store (a store of another name says so).
    name = "session store (Redis)"

    def __init__(self, redis: aioredis.Redis, *, prefix: str = "txl:") -> None:
        self.redis = redis
        self.prefix = prefix
        self.keys = Keys(prefix)

    async def call(self, make: Callable[[], Awaitable[T]], *, writes: bool = False) -> T:
        """`make()`'s result; a failure to reach Redis raises Unavailable, with the cause. A call that `writes`
        and got no answer raises OutcomeUnknown (it may have been applied: failures.py)."""
        try:
            return await make()
        except (RedisError, OSError) as exc:
            timeout = self.redis.connection_pool.connection_kwargs.get("socket_timeout")
            raise failure(exc, store=self.name, writes=writes, timeout=timeout) from exc

    async def replicated(
        self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any], *, replicas: int, timeout_ms: int
    ) -> tuple[Any, int]:
        """Runs a `script` that changes something, then waits (Redis WAIT, on the same connection, in the same
        round trip) up to `timeout_ms` for `replicas` replicas to have it: its reply, and how many did. With no
        replicas to wait for, just the script."""
        if replicas <= 0:
            return await self.call(lambda: script(keys=keys, args=args), writes=True), 0

        async def run() -> list[Any]:
            for attempt in range(2):
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                    pipe.wait(replicas, timeout_ms)
                    try:
                        return list(await pipe.execute())
                    except NoScriptError:  # not run (a restarted or new master): load it, send both again
                        if attempt:
                            raise
                        await self.redis.script_load(script.script)
            raise AssertionError("unreachable")  # pragma: no cover

        reply, acknowledged = await self.call(run, writes=True)
        return reply, int(acknowledged)

    def script(self, *names: str) -> AsyncScript:
        """The scripts `names` (lua/{name}.lua) as one: functions first, then the script that calls them."""
        return self.redis.register_script("\n".join(lua(name) for name in names))

    async def ping(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except (RedisError, OSError):
            return False

    async def hashes(self, keys: Sequence[Any]) -> list[dict[Any, Any]]:
        """The hashes at `keys`, read in one pipeline, in order (empty for a key that does not exist)."""

        async def fetch() -> list[Any]:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hgetall(key)
                return await pipe.execute()

        return await self.call(fetch)

    async def live_indexed(self, index: str, hash_key: Callable[[str], str]) -> list[dict[Any, Any]]:
        """The hashes an owner's index set lists (`hash_key(id)` for each id in `index`), in id order; ids whose
        hash has expired are pruned from the index."""
        ids = sorted(text(m) for m in await self.call(lambda: self.redis.smembers(index)))
        if not ids:
            return []
        rows = await self.hashes([hash_key(item) for item in ids])
        expired = [item for item, raw in zip(ids, rows, strict=True) if not raw]
        if expired:
            await self.call(lambda: self.redis.srem(index, *expired))
        return [raw for raw in rows if raw]
