"""Every Redis store of the server, on one connection under one prefix: what the runtime connects once and hands
to the session service (and to start-up reconciliation before it).

One store per idea (plumbing.py lists their keys): sessions and their stored versions, the single-writer leases,
replica heartbeats, idempotency records, preloaded memories; and Redis's own health as a database. Stored responses build on the sessions' store
(responses.py), made by the Responses API when first used.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import asyncio as aioredis

from .heartbeats import HeartbeatStore
from .idempotency import IdempotencyStore
from .leases import LeaseStore
from .memories import MemoryStore
from .redis_health import RedisHealth
from .sessions import SessionStore


@dataclass(frozen=True)
class Stores:
    sessions: SessionStore
    leases: LeaseStore
    heartbeats: HeartbeatStore
    idempotency: IdempotencyStore
    memories: MemoryStore
    health: RedisHealth

    @classmethod
    def connect(
        cls, redis: aioredis.Redis, *, prefix: str = "txl:", replica: str = "", allow_eviction: bool = False
    ) -> Stores:
        """The stores on `redis` under `prefix`; `replica` (this process's id) names the holder of its leases;
        `allow_eviction`: the operator accepts a Redis that evicts keys (redis_health.py)."""
        sessions = SessionStore(redis, prefix=prefix)
        health = RedisHealth(redis, prefix=prefix, allow_eviction=allow_eviction)
        sessions.on_commit = health.committed
        return cls(
            sessions=sessions,
            leases=LeaseStore(redis, prefix=prefix, replica=replica),
            heartbeats=HeartbeatStore(redis, prefix=prefix),
            idempotency=IdempotencyStore(redis, prefix=prefix),
            memories=MemoryStore(redis, prefix=prefix),
            health=health,
        )
