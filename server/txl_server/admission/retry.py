"""Retry-After, computed: how long a refused client should wait to be served on its next try.

Two parts. The **wait**: how long until the work ahead has drained enough for a request like this one to be
admitted (the caller computes it from its own queue: `policy`, `slots`). The **spacing**: refused clients are not
all sent back to the same moment (where one would be served and the rest refused again), but one after the other,
as fast as the server makes room (the measured interval between two requests ending): each refusal is told the
first free moment of a virtual queue of promised retries, no earlier than its own wait. Promises in the past cost
nothing: a client that does not come back leaves no debt. A client refused again takes a new place, its old one
still counted: so the queue reaches no further than one place for each refusal of the last CROWD_SECONDS (about
the clients waiting now), and never past MAX_RETRY_AFTER_SECONDS.

A promise is kept: the clients due back soon are work ahead of a new request (`due`, each as the work it was
refused for), so that a client sending its next request the moment its last one ends does not take the room a
refused client was told to come back to. A request that arrives when a promise falls due is taken for the
client it was made to (`arrived`: promises are not named, the earliest due one goes), and a promise nobody
came back to is forgotten PROMISE_KEPT_SECONDS after its time.
"""

from __future__ import annotations

import bisect
import collections
import math
import time
from collections.abc import Callable
from typing import Generic, TypeVar

W = TypeVar("W")

MAX_RETRY_AFTER_SECONDS = 30.0  # a bound on what any estimate may tell a client
CROWD_SECONDS = 10.0  # the refusals of this long ago and since count as the clients waiting
PROMISE_KEPT_SECONDS = 2.0  # a promise waits this long for its client
ARRIVAL_GRACE_SECONDS = 0.05  # a request this early for a promise is taken for its client


class RetryQueue(Generic[W]):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last = -math.inf  # the latest moment promised
        self._refused: collections.deque[float] = collections.deque()  # when, lately
        self._promises: list[tuple[float, W]] = []  # (when, the work refused), in order

    def arrived(self, within: float) -> list[W]:
        """A request arrived: the work of the clients promised a retry before it. If a promise falls due now,
        the request is taken for its client (the promise is kept: the earlier promises are ahead of it); else
        the promises due within `within` seconds are. Expired promises are forgotten."""
        now = self.clock()
        promises = self._promises
        while promises and promises[0][0] < now - PROMISE_KEPT_SECONDS:
            promises.pop(0)
        if promises and promises[0][0] <= now + ARRIVAL_GRACE_SECONDS:
            promises.pop(0)
            return []
        return [work for at, work in promises if at <= now + within]

    def after(self, wait: float, interval: float, work: W) -> float:
        """Seconds the client refused `work` should wait: at least `wait`, and `interval` after the previous
        promise (as far as the crowd waiting now reaches)."""
        now = self.clock()
        refused = self._refused
        refused.append(now)
        while refused[0] < now - CROWD_SECONDS:
            refused.popleft()
        earliest = now + max(0.0, wait)
        interval = max(0.0, interval)
        at = max(earliest, min(self._last + interval, earliest + len(refused) * interval))
        at = min(at, now + MAX_RETRY_AFTER_SECONDS)
        self._last = at
        bisect.insort(self._promises, (at, work), key=lambda promise: promise[0])
        return at - now


def header_values(seconds: float) -> dict[str, str]:
    """The headers of a refusal: Retry-After in whole seconds (HTTP's unit: rounded up, at least 1), and
    retry-after-ms exactly (which OpenAI's SDKs read first)."""
    return {
        "Retry-After": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(max(1, round(seconds * 1000))),
    }
