"""Idempotency records: a request's first result under its Idempotency-Key, so that a retry gets it again.

A record `i:{owner}:{key}` is first a claim ("pending", naming the request by its fingerprint) that lives only a
lease's length unless the running request renews it, so that a claim whose process died lapses (a retry then runs
anew instead of answering 409 for a day); then the result, kept for the idempotency TTL (api/idempotency.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redis import asyncio as aioredis

from .plumbing import RedisStore


@dataclass(frozen=True)
class Receipt:
    """An Idempotency-Key's record of a finished request, for the script that makes the request's change to write
    in the same step (sessions.py): a retry then finds the answer even when the change's own reply was lost, and
    never applies the change twice."""

    key: str  # the record's key (`IdempotencyStore.record_key`)
    record: str  # JSON, as `put` writes it
    ttl_seconds: int


def receipt_keys(receipt: Receipt | None) -> list[str]:
    """The receipt's key, as a script's last key (none without one)."""
    return [] if receipt is None else [receipt.key]


def receipt_args(receipt: Receipt | None) -> list[Any]:
    """The receipt's record and TTL, as a script's arguments (placeholders without one)."""
    return ["", 1] if receipt is None else [receipt.record, receipt.ttl_seconds]


def done_record(fingerprint: str, response: dict[str, Any]) -> str:
    """The record of a finished request: its fingerprint and its response."""
    return json.dumps({"state": "done", "fingerprint": fingerprint, "response": response})


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

    def receipt(self, owner: str, key: str, fingerprint: str, response: dict[str, Any], ttl: int) -> Receipt:
        """The record of a finished request, for the script that makes its change to write."""
        return Receipt(self.keys.idempotency(owner, key), done_record(fingerprint, response), ttl)

    async def put(self, owner: str, key: str, fingerprint: str, response: dict[str, Any], ttl: int) -> None:
        record = done_record(fingerprint, response)
        await self.call(lambda: self.redis.set(self.keys.idempotency(owner, key), record, ex=ttl))

    async def drop(self, owner: str, key: str) -> None:
        await self.call(lambda: self.redis.delete(self.keys.idempotency(owner, key)))
