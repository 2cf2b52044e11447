"""Steps on one session take turns in this process.

A step needs the session's single-writer lease (in Redis, `SessionStore.step`). Requests that arrive while
another step holds it wait here, first come first served, rather than polling Redis against each other; a
request whose turn does not come within its wait gets `409` (with Retry-After). Writers in other replicas are
waited for by polling the lease (the store).

Turns are keyed by (owner, session id): a request for a session it does not own never queues behind the
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
class _Turn:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0  # requests holding or waiting for the lock; the entry goes when none is left


class Turns:
    def __init__(self) -> None:
        self._turns: dict[tuple[str, str], _Turn] = {}

    @contextlib.asynccontextmanager
    async def take(self, owner: str, session_id: str, *, wait_seconds: float) -> AsyncIterator[None]:
        """This request's turn on the session, waiting up to `wait_seconds` for the steps before it; raises
        Conflict if they are not done by then."""
        key = (owner, session_id)
        turn = self._turns.setdefault(key, _Turn())
        turn.waiting += 1
        try:
            if wait_seconds <= 0 and turn.waiting > 1:  # no waiting: busy is busy
                raise Conflict(f"{BUSY}; retry when it has finished")
            try:
                await asyncio.wait_for(turn.lock.acquire(), timeout=max(wait_seconds, 0.001))
            except TimeoutError:
                raise Conflict(f"{BUSY}; it did not finish within {wait_seconds:g} s: retry later") from None
            try:
                yield
            finally:
                turn.lock.release()
        finally:
            turn.waiting -= 1
            if turn.waiting == 0:
                del self._turns[key]

    def __len__(self) -> int:
        return len(self._turns)
