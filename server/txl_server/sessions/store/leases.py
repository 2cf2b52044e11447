"""The single-writer lease: one step at a time on a session, across every replica sharing the Redis.

A lease is a key `l:{id}` holding its holder's token ("{replica}/{random}") that expires by itself: a holder that
dies loses it after the lease's TTL, a live one keeps it by renewing it during long steps, and a dead replica's
leases can be broken at start-up at once (its token names it: sessions/recovery.py). A step takes its lease and
reads the session's metadata in one round trip, and its commit hands the lease back (sessions.py); whatever ends
a step otherwise (an error, a client that left) hands it back here, shielded from cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
from redis import asyncio as aioredis
from redis.exceptions import RedisError
from redis.typing import EncodableT

from ...errors import Conflict, NotFound
from .lease import Lease, new_token
from .plumbing import RedisStore, text
from .sessions import SessionMeta

T = TypeVar("T")

# Waiting for a lease held elsewhere: polls from 10 ms, doubling up to 200 ms, so that the end of a short step is
# seen soon and a long one is not polled often.
LEASE_POLL_SECONDS = (0.01, 0.2)


class ResponseNotHeld(Exception):
    """The session no longer holds the response a step was to continue (it was deleted): nothing was taken."""


class LeaseStore(RedisStore):
    def __init__(self, redis: aioredis.Redis, *, prefix: str = "txl:", replica: str = "") -> None:
        super().__init__(redis, prefix=prefix)
        self.replica = replica  # this process's replica id: leases name their holder
        self._begin_step = self.script("begin_step")
        self._release = self.script("delete_if_held")
        self._renew = self.script("renew_if_held")

    @asynccontextmanager
    async def step(
        self,
        session_id: str,
        owner: str,
        ttl_seconds: float,
        *,
        wait_seconds: float = 0.0,
        holding_response: str | None = None,
    ) -> AsyncIterator[tuple[SessionMeta, Lease]]:
        """The owner's session's committed metadata, read under its single-writer lease, in one round trip.
        Raises NotFound (no such session of this owner) before ResponseNotHeld (it no longer holds the response
        `holding_response`, when given) before Conflict (another writer still holds it after `wait_seconds`)."""
        lease = Lease(session_id, self._token(), ttl_seconds)
        keys = [self.keys.session(session_id), self.keys.lease(session_id), self.keys.responses(session_id)]
        args: list[EncodableT] = [owner, lease.token, lease.ttl_ms, holding_response or ""]

        async def attempt() -> list[Any] | None:
            reply = await self.call(lambda: self._begin_step(keys=keys, args=args))
            if reply[0] == -1:
                raise NotFound(f"no session {session_id!r}", param="session_id")
            if reply[0] == -3:
                raise ResponseNotHeld(session_id)
            return None if reply[0] == -2 else list(reply)

        reply = await until_free(attempt, wait_seconds)
        meta = SessionMeta.from_redis(dict(zip(reply[1::2], reply[2::2], strict=True)))
        async with self._holding(lease):
            yield meta, lease

    @asynccontextmanager
    async def lease(
        self, session_id: str, ttl_seconds: float, *, wait_seconds: float = 0.0
    ) -> AsyncIterator[Lease]:
        """Holds the session's single-writer lease, or raises Conflict if another holder keeps it longer than
        `wait_seconds`. A holder that dies loses it after `ttl_seconds`; a live holder keeps it with `renew`
        during long steps."""
        lease = Lease(session_id, self._token(), ttl_seconds)

        async def attempt() -> bool | None:
            key = self.keys.lease(session_id)
            taken = await self.call(lambda: self.redis.set(key, lease.token, nx=True, px=lease.ttl_ms))
            return True if taken else None

        await until_free(attempt, wait_seconds)
        async with self._holding(lease):
            yield lease

    async def renew(self, lease: Lease) -> bool:
        """Extends the lease if its holder still has it."""
        key = self.keys.lease(lease.session_id)
        return bool(await self.call(lambda: self._renew(keys=[key], args=[lease.token, lease.ttl_ms])))

    def _token(self) -> str:
        return new_token(self.replica)

    @asynccontextmanager
    async def _holding(self, lease: Lease) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if not lease.released:  # a commit may have handed it back already
                # Shielded: a cancelled request (a client that left mid-stream) must still hand the lease back.
                with anyio.CancelScope(shield=True), contextlib.suppress(RedisError, OSError):
                    await self._release(
                        keys=[self.keys.lease(lease.session_id)], args=[lease.token]
                    )  # else it expires by itself

    async def held(self) -> AsyncIterator[tuple[str, str]]:
        """(session id, token) of every lease held under this prefix."""
        start = len(self.keys.lease(""))

        async def token_of(key: Any) -> Any:
            return await self.call(lambda: self.redis.get(key))

        async for key in self.redis.scan_iter(match=self.keys.every("l"), count=500):
            token = await token_of(key)
            if token is not None:
                yield text(key)[start:], text(token)

    async def break_lease(self, session_id: str, token: str) -> bool:
        """Deletes a lease whose holder is known to be dead, if it still holds it."""
        return bool(await self.call(lambda: self._release(keys=[self.keys.lease(session_id)], args=[token])))


async def until_free(attempt: Callable[[], Awaitable[T | None]], wait_seconds: float) -> T:
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
