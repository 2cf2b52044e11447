"""Redis as a database: configured so that it never drops a session on its own, and watched for losing data.

Checked at start-up and every few seconds after (and so after a reconnect or a failover):
- `maxmemory-policy` must be `noeviction`: any other policy deletes keys under memory pressure, and every key of a
  session has a TTL, so even the `volatile-*` policies delete live sessions, silently. The server refuses to start
  on such a Redis (one line naming the setting) unless the operator accepts it (`TXL_REDIS_ALLOW_EVICTION`); met
  later (a failover to a Redis configured otherwise), it makes `/ready` fail with the reason.
- Out of memory (`used_memory` at `maxmemory`): writes fail, so `/ready` fails with the reason until Redis has
  room again, and a load balancer sends traffic elsewhere.
- Persistence off (no append-only file): a warning at start-up, since a restart then loses every session.
- The store's identity (`{prefix}store`: an id written when the store was first used, and a count of every commit
  ever made): a Redis that comes back without it came back empty (or is another Redis); one whose count is below
  the highest this process saw came back older (an older snapshot, the end of its append-only file lost, a
  replica promoted before it caught up). Either is logged loudly and counted; the sessions it concerns answer 410
  (acked.py, recovery.py), and the identity is written again so that the next loss is noticed too.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from redis import asyncio as aioredis
from redis.typing import EncodableT

from .plumbing import RedisStore, now, text

log = logging.getLogger(__name__)


class EvictingRedis(RuntimeError):
    """Redis is configured to delete keys under memory pressure (and the operator did not accept it)."""


@dataclass(frozen=True)
class RedisInfo:
    """What INFO says of the Redis the server uses."""

    run_id: str
    role: str
    maxmemory: int
    maxmemory_policy: str
    used_memory: int
    aof_enabled: bool
    connected_replicas: int

    @classmethod
    def of(cls, info: dict[str, Any]) -> RedisInfo:
        return cls(
            run_id=str(info.get("run_id", "")),
            role=str(info.get("role", "master")),
            maxmemory=int(info.get("maxmemory", 0)),
            maxmemory_policy=str(info.get("maxmemory_policy", "noeviction")),
            used_memory=int(info.get("used_memory", 0)),
            aof_enabled=bool(int(info.get("aof_enabled", 0))),
            connected_replicas=int(info.get("connected_slaves", 0)),
        )

    @property
    def evicting(self) -> bool:
        return self.maxmemory_policy != "noeviction"

    @property
    def out_of_memory(self) -> bool:
        return self.maxmemory > 0 and self.used_memory >= self.maxmemory


def eviction_refusal(policy: str) -> str:
    return (
        f"Redis is configured with maxmemory-policy {policy}, which deletes keys (live sessions) under memory "
        "pressure without a word: set it to noeviction (redis.conf `maxmemory-policy noeviction`), or start with "
        "TXL_REDIS_ALLOW_EVICTION=true to accept losing sessions"
    )


@dataclass
class StoreState:
    """What the last check found: why the store cannot take traffic (empty: it can), and its facts."""

    problems: list[str] = field(default_factory=list)
    info: RedisInfo | None = None
    losses: int = 0  # times the store was found to have lost data, since this process started


class RedisHealth(RedisStore):
    """Checks Redis's configuration and watches the store's identity (see the module's docstring)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        prefix: str = "txl:",
        allow_eviction: bool = False,
        on_loss: Any = None,
    ) -> None:
        super().__init__(redis, prefix=prefix)
        self.allow_eviction = allow_eviction
        self.on_loss = on_loss  # called with "empty" | "older" | "replaced" when the store lost data
        self.identity: str | None = None  # the store's id, as this process knows it
        self.highest_commit = 0  # the highest commit count this process saw (commits report theirs)
        self.run_id = ""
        self.state = StoreState()

    async def info(self) -> RedisInfo:
        return RedisInfo.of(await self.call(lambda: self.redis.info()))

    async def start(self) -> RedisInfo:
        """The checks at start-up: raises EvictingRedis on an evicting Redis (unless accepted); warns when
        persistence is off. Then the store's identity is read (or written, for a new store)."""
        info = await self.info()
        if info.evicting:
            if not self.allow_eviction:
                raise EvictingRedis(eviction_refusal(info.maxmemory_policy))
            log.warning("%s (accepted: TXL_REDIS_ALLOW_EVICTION)", eviction_refusal(info.maxmemory_policy))
        if not info.aof_enabled:
            log.warning(
                "Redis keeps no append-only file (appendonly no): a Redis restart loses every session since its "
                "last snapshot, and a failover the commits its replica had not received; set appendonly yes"
            )
        self.run_id = info.run_id
        await self._identity(info)
        return info

    async def check(self) -> StoreState:
        """The periodic check (and `/ready`'s): the store's problems now, and whether it lost data since the
        last check (logged and counted)."""
        info = await self.info()
        problems = []
        if info.evicting and not self.allow_eviction:
            problems.append(eviction_refusal(info.maxmemory_policy))
        if info.out_of_memory:
            problems.append(
                f"Redis is out of memory ({info.used_memory} of maxmemory {info.maxmemory} bytes used): it refuses "
                "writes until sessions expire or are deleted, or maxmemory is raised"
            )
        if info.role != "master":
            problems.append("Redis is a read-only replica (a failover may be under way)")
        if info.run_id != self.run_id:
            log.warning("Redis restarted or failed over (a new run id): checking what it holds")
            self.run_id = info.run_id
        await self._identity(info)
        self.state = StoreState(problems, info, self.state.losses)
        return self.state

    def committed(self, count: int) -> None:
        """A commit reported the store's commit count after it."""
        self.highest_commit = max(self.highest_commit, count)

    async def _identity(self, info: RedisInfo) -> None:
        key = self.keys.store
        raw = {text(k): text(v) for k, v in (await self.call(lambda: self.redis.hgetall(key))).items()}
        if not raw:
            if self.identity is not None:
                self.report_loss("empty", "Redis came back empty (restarted without its data, or flushed)")
            await self._write_identity(self.identity or secrets.token_hex(8))
            return
        identity, commits = raw.get("id", ""), int(raw.get("commits", "0"))
        if self.identity is not None and identity != self.identity:
            self.report_loss(
                "replaced", "Redis holds another store than before (another Redis, or one restored wrong)"
            )
        elif commits < self.highest_commit:
            self.report_loss(
                "older",
                f"Redis came back older: it counts {commits} commits, {self.highest_commit - commits} fewer than "
                "this server saw (restarted from an older snapshot, lost the end of its append-only file, or "
                "failed over to a replica that had not caught up)",
            )
            await self.call(lambda: self.redis.hset(key, "commits", self.highest_commit), writes=True)
        self.identity = identity
        self.highest_commit = max(self.highest_commit, commits)

    async def _write_identity(self, identity: str) -> None:
        key = self.keys.store
        fields: list[EncodableT] = ["id", identity, "created_at", now(), "commits", self.highest_commit]
        await self.call(lambda: self.redis.hset(key, items=fields), writes=True)
        self.identity = identity

    async def uses_block_store(self) -> bool:
        """Whether the sessions in this Redis keep their memories in a block store (`note_block_store`)."""
        return bool(await self.call(lambda: self.redis.hexists(self.keys.store, "blocks")))

    async def note_block_store(self) -> None:
        await self.call(lambda: self.redis.hset(self.keys.store, "blocks", "1"), writes=True)

    def report_loss(self, kind: str, what: str) -> None:
        log.error(
            "THE SESSION STORE LOST DATA: %s. Sessions this server acknowledged answer 410 (store_lost_steps or "
            "store_lost_session); others continue from what Redis holds. Restore Redis from its append-only file "
            "or a replica if you can (docs/reliability.md)",
            what,
        )
        self.state.losses += 1
        if self.on_loss is not None:
            self.on_loss(kind)
