"""Requests on one session wait in line in this process: one queue per session, first come first served.

A step needs the session's single-writer lease (in Redis, store/leases.py). Requests that arrive while another
step holds it wait here, in arrival order, rather than polling Redis against each other; a request whose place
does not come within its wait gets `409` (with Retry-After). Writers in other replicas are waited for by polling
the lease (the store).

Queues are keyed by (owner, session id): a request for a session it does not own never queues behind the
owner's steps, so its `404` comes at once and says nothing about whether the session is busy.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..errors import Conflict

BUSY = "another request is working on this session"


@dataclass
class _Queue:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0  # requests holding or waiting for the lock; the queue goes when none is left


class RequestQueues:
    def __init__(self) -> None:
        self._queues: dict[tuple[str, str], _Queue] = {}

    @contextlib.asynccontextmanager
    async def first_in_line(self, owner: str, session_id: str, *, wait_seconds: float) -> AsyncIterator[None]:
        """Holds the head of the session's queue while the block runs, waiting up to `wait_seconds` for the
        requests before this one; raises Conflict if they are not done by then."""
        key = (owner, session_id)
        queue = self._queues.setdefault(key, _Queue())
        queue.waiting += 1
        try:
            if wait_seconds <= 0 and queue.waiting > 1:  # no waiting: busy is busy
                raise Conflict(f"{BUSY}; retry when it has finished")
            try:
                await asyncio.wait_for(queue.lock.acquire(), timeout=max(wait_seconds, 0.001))
            except TimeoutError:
                raise Conflict(f"{BUSY}; it did not finish within {wait_seconds:g} s: retry later") from None
            try:
                yield
            finally:
                queue.lock.release()
        finally:
            queue.waiting -= 1
            if queue.waiting == 0:
                del self._queues[key]

    def __len__(self) -> int:
        return len(self._queues)
