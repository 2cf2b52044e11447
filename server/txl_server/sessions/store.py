"""Session metadata in Redis: the authority on what sessions exist, who owns them and their version.

Keys (all under the configured prefix):
    s:{id}          hash: the session's metadata; expires with the session (Redis TTL)
    t:{owner}       set: the owner's session ids (pruned of expired ones when listed)
    m:{id}          hash: the session's stored memory (persistence on), same TTL: its kept versions, each a
                    header listing its blocks (see memory_lua.py and engine/blocks.py)
    k:{block}       hash: one block of positions, shared by every version, fork and session that lists it; a
                    commit writes only the blocks the store does not hold yet
    l:{id}          string: the single-writer lease ("{replica}/{random}"), expires by itself
    i:{owner}:{key} string: a request's first result under an Idempotency-Key
    r:{name}        string: a live replica's heartbeat (its incarnation), expires unless renewed

A session's `holder` is the replica ("{name}#{incarnation}") that committed its version: where its memory is
when Redis does not hold that version (persistence `evict` or `none`). A session whose memory is in neither
is marked gone (tier `gone`, with the reason) and leaves its owner's index: it is never listed again, and
answers `410` saying what happened until it expires or is deleted.

Every commit checks and bumps the version atomically (a Lua script), together with the memory's changed blocks
when they are written, so the memory and the metadata never disagree. Any Redis failure surfaces as `Unavailable`, and
changes nothing.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import anyio
from redis import asyncio as aioredis
from redis.exceptions import RedisError
from redis.typing import EncodableT

from ..engine.blocks import StoredVersion
from ..errors import Conflict, NotFound, Unavailable
from . import memory_lua

T = TypeVar("T")

# Waiting for a lease held elsewhere: polls from 10 ms, doubling up to 200 ms (a step takes tens of ms).
LEASE_POLL_SECONDS = (0.01, 0.2)

_COMMIT = (
    memory_lua.FUNCTIONS
    + """
-- KEYS[1] s:{id} (metadata), KEYS[2] m:{id} (memory), KEYS[3] l:{id} (optional: the lease, handed back).
-- ARGV: expected version, ttl, n, n field/value pairs, then mode ('keep' | 'drop' | 'write'); for 'write': block
-- prefix, version, summary, header, hidden, keep, then block id/data pairs; with a lease, its token last.
local version = redis.call('HGET', KEYS[1], 'version')
if not version then return {-1} end
if tonumber(version) ~= tonumber(ARGV[1]) then return {-2} end
if redis.call('HGET', KEYS[1], 'tier') == 'gone' then return {-4} end
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local at = 4 + 2 * n
local mode = ARGV[at]
local last = #ARGV
if KEYS[3] then last = last - 1 end
if mode == 'write' then
    local blocks = {}
    for i = at + 7, last do table.insert(blocks, ARGV[i]) end
    local missing = write_version(KEYS[2], ARGV[at + 1], ttl, ARGV[at + 2], ARGV[at + 3], ARGV[at + 4],
        ARGV[at + 5], tonumber(ARGV[at + 6]), blocks)
    if missing then return {-3, missing} end
elseif mode == 'drop' then
    drop_memory(KEYS[2], ARGV[at + 1])
end
local fields = {}
for i = 1, 2 * n do fields[i] = ARGV[3 + i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ttl)
if KEYS[3] and redis.call('GET', KEYS[3]) == ARGV[#ARGV] then redis.call('DEL', KEYS[3]) end
return {1}
"""
)

_CREATE = (
    memory_lua.FUNCTIONS
    + """
-- KEYS[1] s:{id}, KEYS[2] m:{id}, KEYS[3] t:{owner}. ARGV: ttl, id, n, n field/value pairs, then as _COMMIT's
-- 'write' (or nothing: no stored memory). {1} created, {-3, id} a listed block is not stored (nothing written).
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
local at = 4 + 2 * n
if ARGV[at] == 'write' then
    local blocks = {}
    for i = at + 7, #ARGV do table.insert(blocks, ARGV[i]) end
    local missing = write_version(KEYS[2], ARGV[at + 1], ttl, ARGV[at + 2], ARGV[at + 3], ARGV[at + 4],
        ARGV[at + 5], tonumber(ARGV[at + 6]), blocks)
    if missing then return {-3, missing} end
end
local fields = {}
for i = 1, 2 * n do fields[i] = ARGV[3 + i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('SADD', KEYS[3], ARGV[2])
return {1}
"""
)

_DELETE = (
    memory_lua.FUNCTIONS
    + """
-- KEYS[1] s:{id}, KEYS[2] m:{id}, KEYS[3] l:{id}, KEYS[4] t:{owner}. ARGV: block prefix, id.
drop_memory(KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[2])
return 1
"""
)

_BEGIN_STEP = """
-- KEYS[1] s:{id}, KEYS[2] l:{id}. ARGV: owner, lease token, lease ms. The session's metadata under a new lease,
-- in one round trip: {-1} no such session of this owner (checked first: a foreign session's lease is never
-- touched, so 404 comes before 409), {-2} another writer holds the lease, else {1, field, value, ...}.
local meta = redis.call('HGETALL', KEYS[1])
if #meta == 0 then return {-1} end
local owner = nil
for i = 1, #meta, 2 do if meta[i] == 'owner' then owner = meta[i + 1] end end
if owner ~= ARGV[1] then return {-1} end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return {-2} end
table.insert(meta, 1, 1)
return meta
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_MARK_GONE = (
    memory_lua.FUNCTIONS
    + """
-- KEYS[1] s:{id}, KEYS[2] m:{id}. ARGV: version, reason, the owner index's key prefix, id, block prefix. Marks
-- the session gone if it is still at that version (a commit since means someone holds its memory after all).
local version = redis.call('HGET', KEYS[1], 'version')
if not version or tonumber(version) ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'tier', 'gone', 'gone', ARGV[2])
drop_memory(KEYS[2], ARGV[5])
redis.call('SREM', ARGV[3] .. redis.call('HGET', KEYS[1], 'owner'), ARGV[4])
return 1
"""
)

_TOUCH_TIER = """
local tier = redis.call('HGET', KEYS[1], 'tier')
if tier and tier ~= 'gone' then redis.call('HSET', KEYS[1], 'tier', ARGV[1]) end
return 0
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


@dataclass
class SessionMeta:
    id: str
    owner: str
    created_at: float
    last_used: float
    ttl_seconds: int
    mem_len: int
    model: str
    tokens: int = 0
    mem_tokens: int = 0
    version: int = 0
    tier: str = "device"  # device | host | redis | gone
    holder: str = ""  # the replica that committed this version ("{name}#{incarnation}"; "": older servers)
    gone: str = ""  # with tier "gone": why the memory was lost (sessions/recovery.py `Lost`)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def expires_at(self) -> float:
        return self.last_used + self.ttl_seconds

    def to_redis(self) -> dict[Any, Any]:
        return {k: (json.dumps(v) if k == "metadata" else str(v)) for k, v in asdict(self).items()}

    @classmethod
    def from_redis(cls, raw: Mapping[Any, Any]) -> SessionMeta:
        d = {_text(k): _text(v) for k, v in raw.items()}
        return cls(
            id=d["id"],
            owner=d["owner"],
            created_at=float(d["created_at"]),
            last_used=float(d["last_used"]),
            ttl_seconds=int(d["ttl_seconds"]),
            mem_len=int(d["mem_len"]),
            model=d["model"],
            tokens=int(d["tokens"]),
            mem_tokens=int(d["mem_tokens"]),
            version=int(d["version"]),
            tier=d["tier"],
            holder=d.get("holder", ""),
            gone=d.get("gone", ""),
            metadata=json.loads(d["metadata"]),
        )


class SessionStore:
    def __init__(self, redis: aioredis.Redis, *, prefix: str = "txl:", replica: str = "") -> None:
        self.redis = redis
        self.prefix = prefix
        self.replica = replica  # this process's replica id: leases name their holder
        self._commit = redis.register_script(_COMMIT)
        self._create = redis.register_script(_CREATE)
        self._delete = redis.register_script(_DELETE)
        self._load = redis.register_script(memory_lua.LOAD)
        self._save = redis.register_script(memory_lua.SAVE)
        self._drop = redis.register_script(memory_lua.DROP)
        self._release = redis.register_script(_RELEASE)
        self._mark_gone = redis.register_script(_MARK_GONE)
        self._touch_tier = redis.register_script(_TOUCH_TIER)
        self._begin_step = redis.register_script(_BEGIN_STEP)
        self._renew = redis.register_script(_RENEW)

    # ------------------------------------------------------------------ keys

    def _s(self, session_id: str) -> str:
        return f"{self.prefix}s:{session_id}"

    def _t(self, owner: str) -> str:
        return f"{self.prefix}t:{owner}"

    def _m(self, session_id: str) -> str:
        return f"{self.prefix}m:{session_id}"

    def _l(self, session_id: str) -> str:
        return f"{self.prefix}l:{session_id}"

    @property
    def block_prefix(self) -> str:
        return f"{self.prefix}k:"

    def _i(self, owner: str, key: str) -> str:
        return f"{self.prefix}i:{owner}:{key}"

    def _r(self, name: str) -> str:
        return f"{self.prefix}r:{name}"

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        try:
            return await make()
        except (RedisError, OSError) as exc:
            raise Unavailable("session store (Redis) is unavailable; nothing was changed") from exc

    # ------------------------------------------------------------------ sessions

    async def ping(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except (RedisError, OSError):
            return False

    async def create(self, meta: SessionMeta, write: MemoryWrite | None = None) -> None:
        """Registers a new session (and its first stored version). Raises BlocksMissing if `write` lists a block
        the store does not hold (nothing is written then)."""
        fields = meta.to_redis()
        args: list[Any] = [meta.ttl_seconds, meta.id, len(fields)]
        for key, value in fields.items():
            args += [key, value]
        args += self._write_args(write)
        keys = [self._s(meta.id), self._m(meta.id), self._t(meta.owner)]
        _check_missing(await self._call(lambda: self._create(keys=keys, args=args)))

    def _write_args(self, write: MemoryWrite | None) -> list[Any]:
        if write is None:
            return ["keep"]
        stored = write.stored
        args: list[Any] = [
            "write",
            self.block_prefix,
            str(write.summary.version),
            write.summary.to_json(),
            stored.header_json(),
            stored.hidden or b"",
            max(1, write.keep),
        ]
        for block, data in stored.new_blocks.items():
            args += [block, data]
        return args

    async def get(self, session_id: str) -> SessionMeta | None:
        raw = await self._call(lambda: self.redis.hgetall(self._s(session_id)))
        return SessionMeta.from_redis(raw) if raw else None

    async def commit(
        self,
        meta: SessionMeta,
        *,
        expected_version: int,
        write: MemoryWrite | None = None,
        drop_memory: bool = False,
        lease: Lease | None = None,
    ) -> bool:
        """Writes `meta` (whose version is the new one) if Redis still holds `expected_version`, with the new
        stored version (`write`: its header and the blocks the store does not hold yet), or dropping the stored
        memory (`drop_memory`: it is stale). Returns False if the session is gone; raises Conflict if another
        writer committed first, and BlocksMissing if `write` lists a block the store does not hold (nothing is
        written then). A `lease` given is handed back by the same call (one round trip less per step)."""
        fields = meta.to_redis()
        args: list[Any] = [expected_version, meta.ttl_seconds, len(fields)]
        for key, value in fields.items():
            args += [key, value]
        if write is None:
            args += ["drop", self.block_prefix] if drop_memory else ["keep"]
        else:
            args += self._write_args(write)
        keys = [self._s(meta.id), self._m(meta.id)]
        if lease is not None:
            keys.append(self._l(meta.id))
            args.append(lease.token)
        reply = await self._call(lambda: self._commit(keys=keys, args=args))
        _check_missing(reply)
        if reply[0] == 1 and lease is not None:
            lease.released = True
        if reply[0] == -2:
            raise Conflict("the session was changed by another request; retry with its latest state")
        if reply[0] == -4:
            raise SessionGone(meta.id)
        return bool(reply[0] == 1)

    async def touch_tier(self, session_id: str, tier: str) -> None:
        """Records where the memory now lives (no version change: tiers do not change what a session is); a
        session marked gone stays gone."""
        key = self._s(session_id)
        await self._call(lambda: self._touch_tier(keys=[key], args=[tier]))

    async def delete(self, meta: SessionMeta) -> None:
        """Deletes the session, its stored versions and their references to blocks (blocks other sessions or
        memories list stay)."""
        keys = [self._s(meta.id), self._m(meta.id), self._l(meta.id), self._t(meta.owner)]
        await self._call(lambda: self._delete(keys=keys, args=[self.block_prefix, meta.id]))

    async def list(self, owner: str) -> list[SessionMeta]:
        """The owner's live sessions, oldest first; ids of expired ones are pruned from the index."""
        rows = await live_indexed(self.redis, self._call, self._t(owner), self._s)
        return sorted((SessionMeta.from_redis(raw) for raw in rows), key=lambda m: (m.created_at, m.id))

    async def count(self, owner: str) -> int:
        """The owner's live sessions. Cheap (SCARD) unless the index may hold expired ids near a limit."""
        indexed = int(await self._call(lambda: self.redis.scard(self._t(owner))))
        return indexed

    async def count_exact(self, owner: str) -> int:
        return len(await self.list(owner))

    async def scan(self, batch: int = 500) -> AsyncIterator[Sequence[SessionMeta]]:
        """Every session under this prefix (gone ones included), in batches (start-up reconciliation)."""
        pattern = _glob_escape(self.prefix) + "s:*"

        async def scan_from(at: int) -> Any:
            return await self._call(lambda: self.redis.scan(at, match=pattern, count=batch))

        cursor = 0
        while True:
            cursor, keys = await scan_from(cursor)
            if keys:

                async def fetch(keys: list[Any] = keys) -> list[Any]:
                    async with self.redis.pipeline(transaction=False) as pipe:
                        for key in keys:
                            pipe.hgetall(key)
                        return await pipe.execute()

                yield [SessionMeta.from_redis(raw) for raw in await self._call(fetch) if raw]
            if cursor == 0:
                return

    async def memory_versions(self, session_ids: Sequence[str]) -> dict[str, int]:
        """The version of each session's memory in Redis (sessions without one are left out)."""

        async def fetch() -> list[Any]:
            async with self.redis.pipeline(transaction=False) as pipe:
                for session_id in session_ids:
                    pipe.hmget(self._m(session_id), "v", "version")  # "version": memories before blocks
                return await pipe.execute()

        if not session_ids:
            return {}
        versions = {}
        for session_id, (v, legacy) in zip(session_ids, await self._call(fetch), strict=True):
            if v is not None or legacy is not None:
                versions[session_id] = int(_text(v if v is not None else legacy))
        return versions

    async def mark_gone(self, meta: SessionMeta, reason: str) -> bool:
        """Marks the session gone (still at `meta.version`): tier `gone` with `reason`, its memory deleted,
        out of its owner's index. False if it changed (or went) meanwhile."""
        keys = [self._s(meta.id), self._m(meta.id)]
        args: list[EncodableT] = [meta.version, reason, f"{self.prefix}t:", meta.id, self.block_prefix]
        return bool(await self._call(lambda: self._mark_gone(keys=keys, args=args)))

    # ------------------------------------------------------------------ replicas

    async def beat(self, name: str, incarnation: str, ttl_seconds: float) -> None:
        """This replica is alive for `ttl_seconds` more (a new incarnation of a name replaces the old one)."""
        await self._call(lambda: self.redis.set(self._r(name), incarnation, px=int(ttl_seconds * 1000)))

    async def retire(self, name: str, incarnation: str) -> None:
        """This replica stops: its heartbeat goes at once (if still its own)."""
        await self._call(lambda: self._release(keys=[self._r(name)], args=[incarnation]))

    async def live_replicas(self, holders: Sequence[str]) -> set[str]:
        """Which of these replica ids ("{name}#{incarnation}") have a live heartbeat of that incarnation."""
        holders = sorted(set(holders))
        if not holders:
            return set()
        names = [holder.rpartition("#")[0] for holder in holders]
        beats = await self._call(lambda: self.redis.mget([self._r(name) for name in names]))
        return {
            holder
            for holder, beat in zip(holders, beats, strict=True)
            if beat is not None and holder.rpartition("#")[2] == _text(beat)
        }

    async def leases(self) -> AsyncIterator[tuple[str, str]]:
        """(session id, token) of every lease held under this prefix."""
        pattern = _glob_escape(self.prefix) + "l:*"
        start = len(self.prefix) + 2

        async def token_of(key: Any) -> Any:
            return await self._call(lambda: self.redis.get(key))

        async for key in self.redis.scan_iter(match=pattern, count=500):
            token = await token_of(key)
            if token is not None:
                yield _text(key)[start:], _text(token)

    async def break_lease(self, session_id: str, token: str) -> bool:
        """Deletes a lease whose holder is known to be dead, if it still holds it."""
        return bool(await self._call(lambda: self._release(keys=[self._l(session_id)], args=[token])))

    # ------------------------------------------------------------------ stored memories

    async def save_memory(self, session_id: str, version: int, write: MemoryWrite, ttl: int) -> bool:
        """Replaces the stored memory with one version (a session leaving this process in persistence "evict"),
        if the session is still at `version`. Raises BlocksMissing as `commit` does."""
        args: list[Any] = [self.block_prefix, str(version), ttl, *self._write_args(write)[2:]]
        keys = [self._s(session_id), self._m(session_id)]
        reply = await self._call(lambda: self._save(keys=keys, args=args))
        _check_missing(reply)
        return bool(reply[0] == 1)

    async def load_memory(self, session_id: str, version: int | None = None) -> StoredMemory | None:
        """A stored version (default the newest), read atomically: never half of one commit and half of
        another. None if there is none (or not that version); raises BlocksMissing if a block it lists is gone."""
        key = self._m(session_id)
        args = [self.block_prefix, "" if version is None else str(version)]
        reply = await self._call(lambda: self._load(keys=[key], args=args))
        status = int(reply[0])
        if status == 1:
            header = json.loads(reply[2])
            hidden = _bytes(reply[3]) or None
            return StoredMemory(
                int(_text(reply[1])), header, hidden, [_bytes(b) for b in reply[4:]], None, {}
            )
        if status == -2:
            raise BlocksMissing({_text(reply[1])})
        if status == -1 or version is not None:
            return None
        return await self._load_legacy(session_id)

    async def _load_legacy(self, session_id: str) -> StoredMemory | None:
        """A memory an older server stored: one safetensors value (format 1) or position-keyed blocks (2)."""
        raw = await self._call(lambda: self.redis.hgetall(self._m(session_id)))
        if not raw:
            return None
        fields = {_text(k): v for k, v in raw.items()}
        if "data" in fields:
            return StoredMemory(int(_text(fields["version"])), None, None, [], _bytes(fields["data"]), {})
        if "v" not in fields or "header" not in fields:
            return None
        blocks = {int(k[2:]): _bytes(v) for k, v in fields.items() if k.startswith("b:")}
        hidden = _bytes(fields["hidden"]) if "hidden" in fields else None
        return StoredMemory(int(_text(fields["v"])), json.loads(fields["header"]), hidden, [], None, blocks)

    async def versions(self, session_id: str) -> builtins.list[VersionSummary]:
        """The stored versions' summaries, oldest first (empty if none is stored)."""
        raw = await self._call(lambda: self.redis.hget(self._m(session_id), "vs"))
        if not raw:
            return []
        entries = json.loads(raw)
        return [VersionSummary.from_json(e) for e in entries] if isinstance(entries, list) else []

    async def drop_memory(self, memory_key: str) -> None:
        await self._call(lambda: self._drop(keys=[self._m(memory_key)], args=[self.block_prefix]))

    # ------------------------------------------------------------------ single writer

    @asynccontextmanager
    async def step(
        self, session_id: str, owner: str, ttl_seconds: float, *, wait_seconds: float = 0.0
    ) -> AsyncIterator[tuple[SessionMeta, Lease]]:
        """The owner's session's committed metadata, read under its single-writer lease, in one round trip.
        Raises NotFound (no such session of this owner) before Conflict (another writer still holds it after
        `wait_seconds`)."""
        lease = Lease(self, session_id, self._token(), ttl_seconds)
        keys = [self._s(session_id), self._l(session_id)]
        args: list[EncodableT] = [owner, lease.token, lease.ttl_ms]

        async def attempt() -> list[Any] | None:
            reply = await self._call(lambda: self._begin_step(keys=keys, args=args))
            if reply[0] == -1:
                raise NotFound(f"no session {session_id!r}", param="session_id")
            return None if reply[0] == -2 else list(reply)

        reply = await _until_free(attempt, wait_seconds)
        meta = SessionMeta.from_redis(dict(zip(reply[1::2], reply[2::2], strict=True)))
        async with self._holding(lease):
            yield meta, lease

    @asynccontextmanager
    async def lease(
        self, session_id: str, ttl_seconds: float, *, wait_seconds: float = 0.0
    ) -> AsyncIterator[Lease]:
        """Holds the session's single-writer lease, or raises Conflict if another holder keeps it longer than
        `wait_seconds`. A holder that dies loses it after `ttl_seconds`; a live holder keeps it with
        `Lease.renew` during long steps."""
        lease = Lease(self, session_id, self._token(), ttl_seconds)

        async def attempt() -> bool | None:
            key = self._l(session_id)
            taken = await self._call(lambda: self.redis.set(key, lease.token, nx=True, px=lease.ttl_ms))
            return True if taken else None

        await _until_free(attempt, wait_seconds)
        async with self._holding(lease):
            yield lease

    def _token(self) -> str:
        """A lease's token: its holder's replica id (so that a dead replica's leases can be broken at once), and
        a random part."""
        return f"{self.replica}/{secrets.token_hex(16)}"

    @asynccontextmanager
    async def _holding(self, lease: Lease) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if not lease.released:  # a commit may have handed it back already
                # Shielded: a cancelled request (a client that left mid-stream) must still hand the lease back.
                with anyio.CancelScope(shield=True), contextlib.suppress(RedisError, OSError):
                    await self._release(
                        keys=[self._l(lease.session_id)], args=[lease.token]
                    )  # else it expires by itself

    # ------------------------------------------------------------------ idempotency

    async def get_idempotent(self, owner: str, key: str) -> dict | None:
        raw = await self._call(lambda: self.redis.get(self._i(owner, key)))
        return json.loads(raw) if raw else None

    async def claim_idempotent(self, owner: str, key: str, ttl: int, fingerprint: str = "") -> bool:
        """Marks `key` as in progress for the request `fingerprint` names; False if it is already in progress
        or done."""
        pending = json.dumps({"state": "pending", "fingerprint": fingerprint})
        return bool(await self._call(lambda: self.redis.set(self._i(owner, key), pending, ex=ttl, nx=True)))

    async def renew_idempotent(self, owner: str, key: str, ttl: int, fingerprint: str = "") -> bool:
        """Extends the claim `claim_idempotent` made for `fingerprint` by `ttl` seconds, and nothing else (a
        finished request's record keeps its own expiry); False once the key holds anything else."""
        pending = json.dumps({"state": "pending", "fingerprint": fingerprint})
        renewed = await self._call(
            lambda: self._renew(keys=[self._i(owner, key)], args=[pending, ttl * 1000])
        )
        return bool(renewed)

    async def put_idempotent(self, owner: str, key: str, value: dict, ttl: int) -> None:
        await self._call(lambda: self.redis.set(self._i(owner, key), json.dumps(value), ex=ttl))

    async def drop_idempotent(self, owner: str, key: str) -> None:
        await self._call(lambda: self.redis.delete(self._i(owner, key)))


async def _until_free(attempt: Callable[[], Awaitable[T | None]], wait_seconds: float) -> T:
    """The first result of `attempt` that is not None (None: the lease is held), polling for `wait_seconds`:
    a writer in another replica, or one that died and whose lease has yet to expire. Then Conflict."""
    deadline = time.monotonic() + wait_seconds
    pause = LEASE_POLL_SECONDS[0]
    while True:
        result = await attempt()
        if result is not None:
            return result
        left = deadline - time.monotonic()
        if left <= 0:
            raise Conflict("another request is working on this session: retry when it has finished")
        await asyncio.sleep(min(pause, left))
        pause = min(2 * pause, LEASE_POLL_SECONDS[1])


@dataclass(frozen=True)
class VersionSummary:
    """What the versions list says of one committed step."""

    version: int
    tokens: int  # tokens of the session's text at this version
    created_at: float
    kind: str  # create | append | generate | import | rewind | fork
    text_tail: str | None = None  # the end of the text this step added

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> VersionSummary:
        return cls(
            int(raw["version"]),
            int(raw["tokens"]),
            float(raw["created_at"]),
            str(raw["kind"]),
            raw.get("text_tail"),
        )


@dataclass(frozen=True)
class MemoryWrite:
    """A version to store: its blocks and header, what the versions list says of it, how many versions to keep."""

    stored: StoredVersion
    summary: VersionSummary
    keep: int


@dataclass(frozen=True)
class StoredMemory:
    """A version of a memory as Redis holds it: a header and its blocks' data in table order; or what an older
    server stored (one safetensors value, `legacy`; or position-keyed blocks, `legacy_blocks`)."""

    version: int
    header: dict[str, Any] | None
    hidden: bytes | None
    blocks: list[bytes]
    legacy: bytes | None
    legacy_blocks: dict[int, bytes]


class BlocksMissing(Exception):
    """A version lists blocks the store does not hold (they expired): write them (or read elsewhere)."""

    def __init__(self, ids: set[str]) -> None:
        super().__init__(f"{len(ids)} stored blocks are gone")
        self.ids = ids


class SessionGone(Exception):
    """A commit on a session marked gone meanwhile (its memory was declared lost)."""


def _glob_escape(text: str) -> str:
    """`text` matched literally in a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _check_missing(reply: Any) -> None:
    if int(reply[0]) == -3:
        raise BlocksMissing({_text(reply[1])})


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


@dataclass
class Lease:
    store: SessionStore
    session_id: str
    token: str
    ttl_seconds: float
    released: bool = False

    @property
    def ttl_ms(self) -> int:
        return max(1, int(self.ttl_seconds * 1000))

    async def renew(self) -> bool:
        """Extends the lease if this holder still has it."""
        renewed = await self.store._call(
            lambda: self.store._renew(keys=[self.store._l(self.session_id)], args=[self.token, self.ttl_ms])
        )
        return bool(renewed)


async def live_indexed(
    redis: aioredis.Redis,
    call: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]],
    index: str,
    hash_key: Callable[[str], str],
) -> list[dict[Any, Any]]:
    """The hashes an owner's index set lists (`hash_key(id)` for each id in `index`), read in one pipeline, in id
    order; ids whose hash has expired are pruned from the index. `call` wraps each Redis call (the store's error
    mapping)."""
    ids = sorted(_text(m) for m in await call(lambda: redis.smembers(index)))
    if not ids:
        return []

    async def fetch() -> list[Any]:
        async with redis.pipeline(transaction=False) as pipe:
            for item in ids:
                pipe.hgetall(hash_key(item))
            return await pipe.execute()

    rows = await call(fetch)
    expired = [item for item, raw in zip(ids, rows, strict=True) if not raw]
    if expired:
        await call(lambda: redis.srem(index, *expired))
    return [raw for raw in rows if raw]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def now() -> float:
    return time.time()
