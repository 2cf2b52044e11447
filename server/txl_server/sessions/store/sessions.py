"""Sessions in Redis: the authority on what sessions exist, who owns them, their version and their stored versions.

A session is its metadata (`s:{id}`, in its owner's index `t:{owner}`) and, where Redis keeps its memory, its
stored versions (`m:{id}`, listing blocks `k:{block}`: lua/versions.lua, blocks.py). Every commit checks and bumps
the version atomically (one script), together with the new stored version when one is written, so the memory and
the metadata never disagree; a commit can hand the step's lease back in the same round trip.

A session's `holder` is the replica ("{name}#{incarnation}") that committed its version: where its memory is when
Redis does not hold that version (persistence `evict` or `none`). A session whose memory is in neither is marked
gone (tier `gone`, with the reason) and leaves its owner's index: it is never listed again, and answers `410`
saying what happened until it expires or is deleted (sessions/recovery.py).
"""

from __future__ import annotations

import builtins
import json
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.typing import EncodableT

from ...errors import Conflict
from .idempotency import Receipt, receipt_args, receipt_keys
from .lease import Lease
from .plumbing import HashRecord, RedisStore, as_bytes, field_args, now, text
from .responses import ResponseWrite, no_response_args
from .versions import (
    MAX_BLOCK_AGE_SECONDS,
    LoadedVersion,
    Replay,
    VersionSummary,
    VersionWrite,
    check_written,
    load_status,
    loaded,
)


@dataclass
class SessionMeta(HashRecord):
    json_fields = frozenset({"metadata"})
    later_fields = frozenset({"holder", "gone"})

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


class SessionGone(Exception):
    """A commit on a session marked gone meanwhile (its memory was declared lost)."""


class Fenced(Exception):
    """A change refused because it no longer holds its lease (it expired, another writer took it, or the
    change's outcome was settled as not applied): nothing was written."""


class SessionStore(RedisStore):
    def __init__(self, redis: aioredis.Redis, *, prefix: str = "txl:") -> None:
        super().__init__(redis, prefix=prefix)
        self._create = self.script("fields", "versions", "session_create")
        self._commit = self.script("fields", "versions", "responses", "session_commit")
        self._delete = self.script("fields", "versions", "session_delete")
        self._settle = self.script("settle_step")
        self._reserve = self.script("session_reserve")
        self._mark_lost = self.script("fields", "session_mark_lost")
        self._drop_legacy = self.script("drop_legacy_data")
        # Told the store's commit count after each commit (redis_health.py watches it for a Redis that went back).
        self.on_commit: Callable[[int], None] = lambda count: None
        # Replicas a commit waits for (the runtime sets it from settings and what the master reports), how long,
        # and who hears of a commit answered before enough replicas had it.
        self.wait_replicas = 0
        self.wait_timeout_ms = 1000
        self.on_unreplicated: Callable[[], None] = lambda: None
        self._mark_gone = self.script("versions", "session_mark_gone")
        self._touch_tier = self.script("session_touch_tier")
        self._save = self.script("versions", "save_version")
        self._load = self.script("load_version")
        self._settle_version = self.script("versions", "settle_version")

    # ------------------------------------------------------------------ metadata

    async def reserve(self, owner: str, session_id: str, *, limit: int, lease: Lease) -> bool:
        """Reserves a new session's id in its owner's index under `limit` (exact under concurrency) and takes its
        lease, for `create`. False if the owner's index is full (it may list expired sessions: `list` prunes)."""
        keys = [self.keys.owner_sessions(owner), self.keys.lease(session_id)]
        args: list[EncodableT] = [session_id, limit, lease.token, lease.ttl_ms]
        return bool(await self.call(lambda: self._reserve(keys=keys, args=args), writes=True))

    async def create(
        self,
        meta: SessionMeta,
        write: VersionWrite | None = None,
        *,
        lease: Lease,
        receipt: Receipt | None = None,
    ) -> None:
        """Registers a new session, reserved under `lease` (`reserve`), and its first stored version, writing
        `receipt` with it. Raises BlocksMissing if `write` lists a block the store does not hold, Fenced if the
        lease is no longer the create's (nothing is written then)."""
        head = [meta.ttl_seconds, meta.id, lease.token, lease.op, *receipt_args(receipt)]
        args = [*head, *field_args(meta.to_redis()), *self._write_args(write)]
        keys = [
            self.keys.session(meta.id),
            self.keys.versions(meta.id),
            self.keys.owner_sessions(meta.owner),
            self.keys.lease(meta.id),
            self.keys.store,
            *receipt_keys(receipt),
        ]
        reply = await self._replicated(self._create, keys, args)
        check_written(reply)
        if reply[0] == -5:
            raise Fenced(meta.id)
        self.on_commit(int(reply[1]))

    def _write_args(self, write: VersionWrite | None) -> list[Any]:
        return ["keep"] if write is None else ["write", self.keys.blocks, *write.args()]

    async def get(self, session_id: str) -> SessionMeta | None:
        raw = await self.call(lambda: self.redis.hgetall(self.keys.session(session_id)))
        return SessionMeta.from_redis(raw) if raw else None

    async def commit(
        self,
        meta: SessionMeta,
        *,
        expected_version: int,
        lease: Lease,
        write: VersionWrite | Replay | None = None,
        drop_stored: bool = False,
        receipt: Receipt | None = None,
        response: ResponseWrite | None = None,
    ) -> bool:
        """Writes `meta` (whose version is the new one) if Redis still holds `expected_version` and the step still
        holds its `lease` (handed back by the commit), with the new stored version (`write`: its header and the
        blocks the store does not hold yet; or a Replay, the version ahead of its blocks), or dropping the stored
        versions (`drop_stored`: they are stale), `receipt`, and the turn's `response` record. Returns False if the session is gone; raises
        Conflict if another writer committed first, SessionGone if it was marked gone, Fenced if the lease is no
        longer the step's, BlocksMissing if `write` lists a block the store does not hold, and ReplayRefused if
        Redis would not write the Replay (nothing is written then)."""
        args: list[Any] = [
            expected_version,
            meta.ttl_seconds,
            lease.token,
            lease.op,
            *receipt_args(receipt),
            *(response.args() if response is not None else no_response_args()),
            *field_args(meta.to_redis()),
        ]
        if write is None:
            args += ["drop", self.keys.blocks] if drop_stored else ["keep"]
        elif isinstance(write, Replay):
            args += ["replay", self.keys.blocks, *write.args(expected_version)]
        else:
            args += self._write_args(write)
        keys = [
            self.keys.session(meta.id),
            self.keys.versions(meta.id),
            self.keys.lease(meta.id),
            self.keys.store,
            self.keys.responses(meta.id),
            *receipt_keys(receipt),
        ]
        reply = await self._replicated(self._commit, keys, args)
        check_written(reply)
        if reply[0] == -2:
            raise Conflict("the session was changed by another request; retry with its latest state")
        if reply[0] == -4:
            raise SessionGone(meta.id)
        if reply[0] == -5:
            raise Fenced(meta.id)
        if reply[0] == 1:
            self.on_commit(int(reply[1]))
        return bool(reply[0] == 1)

    async def settle(self, session_id: str, *, kind: str, lease: Lease) -> int | None:
        """Whether the change of the step holding `lease` (a create or a commit, `kind` "commit"; or a deletion,
        "delete"), whose reply was lost, was applied: the version it made (0 for a deletion), or None if it was
        not, and now never will be (its lease is handed back). Raises Unavailable while Redis does not answer."""
        keys = [self.keys.session(session_id), self.keys.lease(session_id)]
        args: list[EncodableT] = [kind, lease.op, lease.token]
        reply = await self.call(lambda: self._settle(keys=keys, args=args), writes=True)
        return int(reply[1]) if int(reply[0]) == 1 else None

    async def _replicated(self, script: AsyncScript, keys: list[Any], args: list[Any]) -> Any:
        """A commit's or create's script, waiting for `wait_replicas` replicas to have it."""
        reply, acknowledged = await self.replicated(
            script, keys, args, replicas=self.wait_replicas, timeout_ms=self.wait_timeout_ms
        )
        if reply[0] == 1 and acknowledged < self.wait_replicas:
            self.on_unreplicated()
        return reply

    async def touch_tier(self, session_id: str, tier: str) -> None:
        """Records where the memory now lives (no version change: tiers do not change what a session is); a
        session marked gone stays gone."""
        key = self.keys.session(session_id)
        await self.call(lambda: self._touch_tier(keys=[key], args=[tier]))

    async def delete(self, meta: SessionMeta, *, lease: Lease, receipt: Receipt | None = None) -> None:
        """Deletes the session, its stored versions and their references to blocks (blocks other sessions or
        memories list stay), under the deletion's lease, writing `receipt` with it. Raises Fenced if the lease
        is no longer the deletion's (nothing deleted)."""
        keys = [
            self.keys.session(meta.id),
            self.keys.versions(meta.id),
            self.keys.lease(meta.id),
            self.keys.owner_sessions(meta.owner),
            self.keys.deleted(meta.id),
            *receipt_keys(receipt),
        ]
        args = [self.keys.blocks, meta.id, lease.token, *receipt_args(receipt)]
        reply = await self.call(lambda: self._delete(keys=keys, args=args), writes=True)
        if int(reply[0]) == -5:
            raise Fenced(meta.id)

    async def list(self, owner: str) -> list[SessionMeta]:
        """The owner's live sessions, oldest first; ids of expired ones are pruned from the index."""
        rows = await self.live_indexed(self.keys.owner_sessions(owner), self.keys.session)
        return sorted((SessionMeta.from_redis(raw) for raw in rows), key=lambda m: (m.created_at, m.id))

    async def count(self, owner: str) -> int:
        """The owner's live sessions. Cheap (SCARD) unless the index may hold expired ids near a limit."""
        return int(await self.call(lambda: self.redis.scard(self.keys.owner_sessions(owner))))

    async def count_exact(self, owner: str) -> int:
        return len(await self.list(owner))

    async def scan(self, batch: int = 500) -> AsyncIterator[Sequence[SessionMeta]]:
        """Every session under this prefix (gone ones included), in batches (start-up reconciliation)."""
        pattern = self.keys.every("s")

        async def scan_from(at: int) -> Any:
            return await self.call(lambda: self.redis.scan(at, match=pattern, count=batch))

        cursor = 0
        while True:
            cursor, keys = await scan_from(cursor)
            if keys:
                yield [SessionMeta.from_redis(raw) for raw in await self.hashes(keys) if raw]
            if cursor == 0:
                return

    async def mark_gone(self, meta: SessionMeta, reason: str) -> bool:
        """Marks the session gone (still at `meta.version`): tier `gone` with `reason`, its stored versions
        deleted, out of its owner's index. False if it changed (or went) meanwhile."""
        keys = [self.keys.session(meta.id), self.keys.versions(meta.id)]
        args: list[EncodableT] = [
            meta.version,
            reason,
            self.keys.owner_sessions_prefix,
            meta.id,
            self.keys.blocks,
        ]
        return bool(await self.call(lambda: self._mark_gone(keys=keys, args=args), writes=True))

    async def was_deleted(self, session_id: str) -> bool:
        """Whether the session was deleted (for as long as it would have lived)."""
        return bool(await self.call(lambda: self.redis.exists(self.keys.deleted(session_id))))

    async def mark_lost(self, meta: SessionMeta, reason: str) -> bool:
        """Records a session the store lost whole (this process acknowledged `meta`) as gone for `reason`, for
        every replica, unless Redis holds it again meanwhile."""
        ttl = max(1, math.ceil(meta.expires_at - now()))
        args = [ttl, reason, *field_args(meta.to_redis())]
        key = self.keys.session(meta.id)
        return bool(await self.call(lambda: self._mark_lost(keys=[key], args=args), writes=True))

    # ------------------------------------------------------------------ block references

    async def referenced(self, block_ids: Sequence[str]) -> set[str]:
        """Which of these blocks some kept version still lists (their reference keys exist)."""

        async def fetch() -> builtins.list[Any]:
            async with self.redis.pipeline(transaction=False) as pipe:
                for block in block_ids:
                    pipe.exists(self.keys.blocks + block)
                return await pipe.execute()

        if not block_ids:
            return set()
        found = await self.call(fetch)
        return {block for block, exists in zip(block_ids, found, strict=True) if exists}

    async def take_sweep_lock(self, token: str, ttl_ms: int) -> bool:
        """The block sweeper's lock, for this replica (`token`) for `ttl_ms`: kept if it held it already."""
        key = self.keys.sweep_lock

        async def take() -> bool:
            if await self.redis.set(key, token, nx=True, px=ttl_ms):
                return True
            held = await self.redis.get(key)
            return held is not None and text(held) == token and bool(await self.redis.pexpire(key, ttl_ms))

        return await self.call(take)

    async def legacy_blocks(self, batch: int = 200) -> AsyncIterator[dict[str, bytes]]:
        """The blocks whose bytes an older server kept in Redis, in batches (id -> bytes)."""
        start = len(self.keys.blocks)

        async def scan_from(at: int) -> Any:
            return await self.call(lambda: self.redis.scan(at, match=self.keys.every("k"), count=batch))

        async def data(keys: builtins.list[Any]) -> builtins.list[Any]:
            async def fetch() -> builtins.list[Any]:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.hget(key, "d")
                    return await pipe.execute()

            return await self.call(fetch)

        cursor = 0
        while True:
            cursor, keys = await scan_from(cursor)
            if keys:
                values = await data(keys)
                found = {text(k)[start:]: as_bytes(v) for k, v in zip(keys, values, strict=True) if v}
                if found:
                    yield found
            if cursor == 0:
                return

    async def drop_legacy_data(self, block_ids: builtins.list[str]) -> int:
        """Drops from Redis the bytes of blocks now in the block store; how many were dropped."""
        keys = [self.keys.blocks + block for block in block_ids]
        return int(await self.call(lambda: self._drop_legacy(keys=keys), writes=True))

    # ------------------------------------------------------------------ stored versions

    async def save_version(self, session_id: str, version: int, write: VersionWrite, ttl: int) -> bool:
        """Replaces the stored versions with one (a session leaving this process in persistence "evict"), if the
        session is still at `version`. Raises BlocksMissing as `commit` does."""
        args: list[Any] = [self.keys.blocks, str(version), ttl, *write.args()]
        keys = [self.keys.session(session_id), self.keys.versions(session_id)]
        reply = await self.call(lambda: self._save(keys=keys, args=args), writes=True)
        check_written(reply)
        return bool(reply[0] == 1)

    async def settle_version(self, session_id: str, write: VersionWrite, ttl: int) -> bool:
        """Settles a version committed ahead of its blocks (a Replay) with its own header, its new blocks now in the
        block store: whether it did (False: the version is no longer kept, or was settled). Raises BlocksMissing
        as `commit` does (nothing written)."""
        stored = write.stored
        args: list[Any] = [
            self.keys.blocks,
            ttl,
            str(write.summary.version),
            stored.header_json(),
            stored.hidden or b"",
            int(write.written_at),
            MAX_BLOCK_AGE_SECONDS,
            *stored.new_ids,
        ]
        key = self.keys.versions(session_id)
        reply = await self.call(lambda: self._settle_version(keys=[key], args=args), writes=True)
        check_written(reply)
        return bool(reply[0] == 1)

    async def load_version(self, session_id: str, version: int | None = None) -> LoadedVersion | None:
        """A stored version (default the newest), read atomically: never half of one commit and half of
        another. None if there is none (or not that version); raises BlocksMissing if a block it lists is gone."""
        key = self.keys.versions(session_id)
        args = [self.keys.blocks, "" if version is None else str(version)]
        reply = await self.call(lambda: self._load(keys=[key], args=args))
        status = load_status(reply)
        if status == 1:
            return loaded(reply)
        if status == -1 or version is not None:
            return None
        return await self._load_legacy(session_id)

    async def _load_legacy(self, session_id: str) -> LoadedVersion | None:
        """A state an older server stored: one safetensors value (format 1) or position-keyed blocks (2)."""
        raw = await self.call(lambda: self.redis.hgetall(self.keys.versions(session_id)))
        if not raw:
            return None
        fields = {text(k): v for k, v in raw.items()}
        if "data" in fields:
            return LoadedVersion(int(text(fields["version"])), None, None, [], as_bytes(fields["data"]), {})
        if "v" not in fields or "header" not in fields:
            return None
        blocks = {int(k[2:]): as_bytes(v) for k, v in fields.items() if k.startswith("b:")}
        hidden = as_bytes(fields["hidden"]) if "hidden" in fields else None
        return LoadedVersion(int(text(fields["v"])), json.loads(fields["header"]), hidden, [], None, blocks)

    async def versions(self, session_id: str) -> builtins.list[VersionSummary]:
        """The stored versions' summaries, oldest first (empty if none is stored)."""
        raw = await self.call(lambda: self.redis.hget(self.keys.versions(session_id), "vs"))
        if not raw:
            return []
        entries = json.loads(raw)
        return [VersionSummary.from_json(e) for e in entries] if isinstance(entries, list) else []

    async def newest_stored(self, session_ids: Sequence[str]) -> dict[str, int]:
        """The newest version Redis stores of each session (sessions with none are left out)."""

        async def fetch() -> builtins.list[Any]:
            async with self.redis.pipeline(transaction=False) as pipe:
                for session_id in session_ids:
                    pipe.hmget(self.keys.versions(session_id), "v", "version")  # "version": format 1
                return await pipe.execute()

        if not session_ids:
            return {}
        versions = {}
        for session_id, (v, legacy) in zip(session_ids, await self.call(fetch), strict=True):
            if v is not None or legacy is not None:
                versions[session_id] = int(text(v if v is not None else legacy))
        return versions
