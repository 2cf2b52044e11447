"""Idempotency records: a request's first result under its Idempotency-Key, so that a retry gets it again.

A record `i:{owner}:{key}` is first a claim ("pending", naming the request by its fingerprint) that lives only a
lease's length unless the running request renews it, so that a claim whose process died lapses (a retry then runs
anew instead of answering 409 for a day); then the result, kept for the idempotency TTL (api/idempotency.py).
"""

from __future__ import annotations

import json

from redis import asyncio as aioredis

from .plumbing import RedisStore


def _pending(fingerprint: str) -> str:
    return json.dumps({"state": "pending", "fingerprint": fingerprint})


class IdempotencyStore(RedisStore):
    def __init__(self, redis: aioredis.Redis, *, prefix: str = "txl:") -> None:
        super().__init__(redis, prefix=prefix)
        self._renew = self.script("renew_if_held")

    async def get(self, owner: str, key: str) -> dict | None:
        raw = await self.call(lambda: self.redis.get(self.keys.idempotency(owner, key)))
        return json.loads(raw) if raw else None

    async def claim(self, owner: str, key: str, ttl: int, fingerprint: str = "") -> bool:
        """Marks `key` as in progress for the request `fingerprint` names; False if it is already in progress
        or done."""
        record = self.keys.idempotency(owner, key)
        return bool(await self.call(lambda: self.redis.set(record, _pending(fingerprint), ex=ttl, nx=True)))

    async def renew(self, owner: str, key: str, ttl: int, fingerprint: str = "") -> bool:
        """Extends the claim `claim` made for `fingerprint` by `ttl` seconds, and nothing else (a finished
        request's record keeps its own expiry); False once the key holds anything else."""
        record = self.keys.idempotency(owner, key)
        return bool(
            await self.call(lambda: self._renew(keys=[record], args=[_pending(fingerprint), ttl * 1000]))
        )

    async def put(self, owner: str, key: str, value: dict, ttl: int) -> None:
        await self.call(lambda: self.redis.set(self.keys.idempotency(owner, key), json.dumps(value), ex=ttl))

    async def drop(self, owner: str, key: str) -> None:
        await self.call(lambda: self.redis.delete(self.keys.idempotency(owner, key)))
