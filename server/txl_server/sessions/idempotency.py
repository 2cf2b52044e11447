"""An Idempotency-Key's call: a retried request returns the first one's result instead of doing the work again.

A key belongs to its owner and its scope (the HTTP layer's: the method and the path), and remembers a fingerprint
of the request. While the first request runs, its claim on the key lasts a lease and is renewed (a claim whose
process died lapses, and a retry, on any replica, runs anew); a retry meanwhile gets 409. Once it has finished, a
retry gets its response; if it failed, the key is released and a retry runs anew; a key reused with a different
fingerprint is refused (422 `idempotency_key_reused`). The records are in Redis (store/idempotency.py); the HTTP
layer makes one call per request (api/shared/idempotency.py) and runs its work through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import Conflict, IdempotencyKeyReused, OutcomeUnknown, Unavailable
from .step import to_the_end
from .store.idempotency import IdempotencyStore, Receipt

Outcome = TypeVar("Outcome")


class IdempotentCall:
    def __init__(
        self,
        store: IdempotencyStore,
        *,
        owner: str,
        scope: str,
        key: str | None,
        fingerprint: str,
        ttl: int,
        claim_ttl: int = 10,
    ) -> None:
        self.store, self.owner, self.fingerprint, self.ttl = store, owner, fingerprint, ttl
        self.claim_ttl = claim_ttl  # seconds a claim outlives its process
        self.key = f"{scope}:{key}" if key else None
        self._keeper: asyncio.Task[None] | None = None
        self._recorded = False  # the record is written by the step's commit (`receipt`)

    async def run(self, work: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """The stored response of an earlier call with this key, else `work()`'s (stored under the key)."""
        if (stored := await self.replay()) is not None:
            return stored
        return await self.execute(work)

    async def run_unanswered(self, work: Callable[[], Awaitable[object]]) -> None:
        """`run` for a request whose answer is empty (a deletion): `work()` once per key."""

        async def answered() -> dict[str, Any]:
            await work()
            return {}

        await self.run(answered)

    async def execute(self, work: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """`work()`'s response, stored under the key that `replay()` claimed (or the key released if it fails)."""
        try:
            response = await work()
        except BaseException as exc:
            await self.failed(exc)
            raise
        await self.succeeded(response)
        return response

    def receipt(self, render: Callable[[Outcome], dict[str, Any]]) -> Callable[[Outcome], Receipt | None]:
        """For the step this request runs: the key's record of its outcome (`render(outcome)`, the response),
        which the step's commit writes in the same step as its change (None without a key). A retry then finds
        the response even if the commit's own reply was lost, and never runs the step twice."""

        def record(outcome: Outcome) -> Receipt | None:
            if self.key is None:
                return None
            self._recorded = True
            return self.store.receipt(self.owner, self.key, self.fingerprint, render(outcome), self.ttl)

        return record

    async def replay(self) -> dict[str, Any] | None:
        """The stored result of an earlier call with this key, if any; claims the key otherwise."""
        if self.key is None:
            return None
        if await self._claim(self.key):
            return None
        stored = await self.store.get(self.owner, self.key)
        if stored is None:  # expired between the two calls: run
            return None if await self._claim(self.key) else await self.replay()
        if stored.get("fingerprint", self.fingerprint) != self.fingerprint:
            raise IdempotencyKeyReused(
                "this Idempotency-Key was used with a different request body; use a new key for a new request",
                param="Idempotency-Key",
            )
        if stored.get("state") == "pending":
            raise Conflict(
                "a request with this Idempotency-Key is still in progress", param="Idempotency-Key"
            )
        return dict(stored["response"])

    async def succeeded(self, response: dict[str, Any]) -> None:
        self._stop_keeping()
        if self.key is not None and not self._recorded:  # a step's commit wrote its record already
            # Even if the client leaves meanwhile: the work is done, and a retry must get it, not redo it.
            await to_the_end(self.store.put(self.owner, self.key, self.fingerprint, response, self.ttl))

    async def failed(self, error: BaseException | None = None) -> None:
        """The request failed with `error`: the key is released for a retry to run anew, unless the outcome of
        the request's change is unknown (it may have been applied: its commit then wrote the key's record, else
        the claim lapses once the change can no longer arrive, and a retry runs then)."""
        self._stop_keeping()
        if self.key is not None and not isinstance(error, OutcomeUnknown):
            await to_the_end(self.store.drop(self.owner, self.key))

    async def _claim(self, key: str) -> bool:
        """Claims `key` for `claim_ttl` seconds, renewed while this request runs (a claim that lasted the
        record's whole TTL would answer every retry 409 for a day after its process died)."""
        if not await self.store.claim(self.owner, key, self.claim_ttl, self.fingerprint):
            return False
        self._keeper = asyncio.create_task(
            _keep_claim(weakref.ref(self), self.store, self.owner, key, self.fingerprint, self.claim_ttl)
        )
        return True

    def _stop_keeping(self) -> None:
        # Not awaited: the outcome's write must not wait (a cancellation there would lose it), and a renewal still
        # in flight cannot touch it (renew extends only this claim's own pending record).
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()


async def _keep_claim(
    call: weakref.ref[IdempotentCall],
    store: IdempotencyStore,
    owner: str,
    key: str,
    fingerprint: str,
    ttl: int,
) -> None:
    """Renews a claim at a third of its TTL until its request has an outcome, or is gone without one (then the
    claim lapses). Holds the request only weakly, so that a request dropped unfinished cannot keep it forever."""
    while True:
        await asyncio.sleep(ttl / 3)
        if call() is None:
            return
        renewed = True
        with contextlib.suppress(Unavailable):  # Redis away for a moment: the claim may still hold; next tick
            renewed = await store.renew(owner, key, ttl, fingerprint)
        if not renewed:
            return  # the request's outcome replaced the claim
