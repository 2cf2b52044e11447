"""Retry-After, computed: how long a refused client should wait to be served on its next try.

Two parts. The **wait**: how long until the work ahead has drained enough for a request like this one to be
admitted (the caller computes it from its own queue: `policy`, `slots`). The **spacing**: refused clients are not
all sent back to the same moment (where one would be served and the rest refused again), but one after the other,
as fast as the server makes room (the measured interval between two requests ending): each refusal is told the
first free moment of a virtual queue of promised retries, no earlier than its own wait. Promises in the past cost
nothing: a client that does not come back leaves no debt. A client refused again takes a new place, its old refusal
still counted: so the queue reaches no further than one place for each refusal of the last CROWD_SECONDS (about
the clients waiting now), and never past MAX_RETRY_AFTER_SECONDS.

A promise is kept: the clients due back soon are work ahead of a new request (`arrived`, each as the work it was
refused for), so that a client sending its next request the moment its last one ends does not take the room a
refused client was told to come back to; as many of them as clients came back lately (`kept`): promises to
clients that never come back (open-loop traffic, which is not retried) would otherwise refuse every newcomer for
work that never comes, each refusal making one more. A promise is made to the request refused (its `key`: a retry resends
the same request, as OpenAI's SDKs and any client that honours Retry-After do), and only that request takes it
when it comes back: a new request that happens to arrive at the promised moment is a new request, with the
promises due soon ahead of it (anonymous promises, taken by whichever request came first, were taken by those
about half the time, and the client they were made to was then refused again). A request that comes back early
has the others' promises ahead of it, not its own; one refused again gives up its old place for a new one. A
request without a key (`None`) takes the earliest due promise. A promise nobody came back to is forgotten
PROMISE_KEPT_SECONDS after its time in whole seconds.
"""

from __future__ import annotations

import bisect
import collections
import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

W = TypeVar("W")

MAX_RETRY_AFTER_SECONDS = 30.0  # a bound on what any estimate may tell a client
CROWD_SECONDS = 10.0  # the refusals of this long ago and since count as the clients waiting
# A promise waits this long for its client after the time its Retry-After said in whole seconds (rounded up):
# one that reads only that header comes back up to a second after the promised moment.
PROMISE_KEPT_SECONDS = 0.5
ARRIVAL_GRACE_SECONDS = 0.05  # a request this early for a promise is taken for its client
KEPT_SMOOTHING = 0.1  # each promise's weight in the share of promises kept


@dataclass(frozen=True)
class Promise(Generic[W]):
    at: float  # when its client was told to come back (time.monotonic())
    work: W  # what it was refused for
    key: Hashable | None  # the request refused (None: unknown)
    until: float  # when it is forgotten, its client not back


class RetryQueue(Generic[W]):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last = -math.inf  # the latest moment promised
        self._refused: collections.deque[float] = collections.deque()  # when, lately
        self._promises: list[Promise[W]] = []  # in the order they fall due
        self.kept = 1.0  # the share of promises whose client came back, lately (a running mean)

    def arrived(self, within: float, key: Hashable | None = None) -> list[W]:
        """The request `key` arrived: the work of the clients promised a retry before it. If its own promise
        falls due now (or the earliest one does, for a request without a key), the request is taken for the
        client it was made to, in its turn: nothing is ahead of it. Else the promises due within `within`
        seconds are, its own aside. Expired promises are forgotten."""
        now = self.clock()
        self._forget(now)
        promises = self._promises
        mine = self._of(key) if key is not None else (promises[0] if promises else None)
        if mine is not None and mine.at <= now + ARRIVAL_GRACE_SECONDS:
            promises.remove(mine)
            self._learn(kept=True)
            return []
        due = [p.work for p in promises if p.at <= now + within and p is not mine]
        return due[: round(len(due) * self.kept)]  # as many as come back: open-loop clients never do

    def after(self, wait: float, interval: float, work: W, key: Hashable | None = None) -> float:
        """Seconds the client refused `work` (the request `key`) should wait: at least `wait`, and `interval`
        after the previous promise (as far as the crowd waiting now reaches)."""
        now = self.clock()
        self._forget(now)
        earlier = self._of(key) if key is not None else None
        if earlier is not None:  # back early and refused again: it takes a new place
            self._promises.remove(earlier)
            self._learn(kept=True)
        refused = self._refused
        refused.append(now)
        while refused[0] < now - CROWD_SECONDS:
            refused.popleft()
        earliest = now + max(0.0, wait)
        interval = max(0.0, interval)
        waiting = len(refused) * self.kept  # the refused clients that will come back
        at = max(earliest, min(self._last + interval, earliest + waiting * interval))
        at = min(at, now + MAX_RETRY_AFTER_SECONDS)
        self._last = at
        until = now + math.ceil(at - now) + PROMISE_KEPT_SECONDS
        bisect.insort(self._promises, Promise(at, work, key, until), key=lambda promise: promise.at)
        return at - now

    def _forget(self, now: float) -> None:
        """Drops the promises whose client did not come back in time."""
        forgotten = [p for p in self._promises if p.until < now]
        for promise in forgotten:
            self._promises.remove(promise)
            self._learn(kept=False)

    def _learn(self, *, kept: bool) -> None:
        self.kept += KEPT_SMOOTHING * (float(kept) - self.kept)

    def _of(self, key: Hashable) -> Promise[W] | None:
        return next((p for p in self._promises if p.key == key), None)


def header_values(seconds: float) -> dict[str, str]:
    """The headers of a refusal: Retry-After in whole seconds (HTTP's unit: rounded up, at least 1), and
    retry-after-ms exactly (which OpenAI's SDKs read first)."""
    return {
        "Retry-After": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(max(1, round(seconds * 1000))),
    }
