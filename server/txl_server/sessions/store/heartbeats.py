"""Replica heartbeats: which server processes sharing the Redis are alive.

Each replica renews a key `r:{name}` holding its incarnation (a random id per process start), with a TTL; a replica
is alive while its key holds its own incarnation. A replica's name is its host and port, which two live processes
cannot share: one restarted after `kill -9` overwrites its own heartbeat, so its earlier incarnation is dead at
once, not after the TTL (sessions/recovery.py decides what that means for the sessions it held).
"""

from __future__ import annotations

from collections.abc import Sequence

from redis import asyncio as aioredis

from .plumbing import RedisStore, text


class HeartbeatStore(RedisStore):
    def __init__(self, redis: aioredis.Redis, *, prefix: str = "txl:") -> None:
        super().__init__(redis, prefix=prefix)
        self._retire = self.script("delete_if_held")

    async def beat(self, name: str, incarnation: str, ttl_seconds: float) -> None:
        """This replica is alive for `ttl_seconds` more (a new incarnation of a name replaces the old one)."""
        key = self.keys.heartbeat(name)
        await self.call(lambda: self.redis.set(key, incarnation, px=int(ttl_seconds * 1000)))

    async def retire(self, name: str, incarnation: str) -> None:
        """This replica stops: its heartbeat goes at once (if still its own)."""
        await self.call(lambda: self._retire(keys=[self.keys.heartbeat(name)], args=[incarnation]))

    async def live(self, holders: Sequence[str]) -> set[str]:
        """Which of these replica ids ("{name}#{incarnation}") have a live heartbeat of that incarnation."""
        holders = sorted(set(holders))
        if not holders:
            return set()
        names = [holder.rpartition("#")[0] for holder in holders]
        beats = await self.call(lambda: self.redis.mget([self.keys.heartbeat(name) for name in names]))
        return {
            holder
            for holder, beat in zip(holders, beats, strict=True)
            if beat is not None and holder.rpartition("#")[2] == text(beat)
        }
