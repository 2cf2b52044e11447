"""Admit, or refuse at once: a new request is admitted when the estimate (`estimate.first_token`) says its first
token comes within the time-to-first-token target, counting only the wait that others' work adds (a long prompt
is never refused for its own length: it may always queue for QUEUE_FLOOR of the target); otherwise it is refused
with a reason and a Retry-After computed from how fast the queue drains (`retry`). Running streams keep their
time between tokens by the batch's cap (`pacing`), whatever is admitted.

By lane: interactive work (priority and default) is judged by the work ahead of it, which for priority is less
(it goes before its tenant's default work): it is refused last. Flex work has every interactive request ahead of
it, so it is refused first, with the same target. Batch work (background responses, long scoring) is never
refused for latency: it waits for what interactive work leaves, bounded by the worker's queue (TXL_MAX_QUEUED_JOBS).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from .classes import Lane
from .estimate import Backlog, Wait, Work, first_token
from .fair_share import even
from .retry import RetryQueue
from .targets import LatencyTargets

QUEUE_FLOOR = 0.25  # of the TTFT target: what a request may always wait for others, however long it is itself
# A request is admitted when its estimate is within this share of the target: the estimate errs either way, and
# one admitted at the very edge would miss the target about as often as it kept it.
ADMIT_SHARE = 0.8
# The estimate checks itself: each admitted request's first token, as it came, against its estimate (from the
# request's start); the running mean of their ratio scales later estimates. Only waits long enough to matter
# teach it (an idle server's few milliseconds are noise), the ratio is bounded, and what it learned fades back to
# 1 over FACTOR_MEMORY_SECONDS without news (a factor learned in a burst must not keep the door shut once the
# burst is gone: only admitted requests could teach it otherwise).
LEARN_FROM_SECONDS = 0.05
FACTOR_SMOOTHING = 0.1
FACTOR_BOUNDS = (0.5, 4.0)
FACTOR_MEMORY_SECONDS = 10.0

# Refusal reasons (the error's `code`; docs/api.md lists them).
FIRST_TOKEN_TARGET = "first_token_target"  # noqa: S105 - a reason, not a secret
FLEX_CAPACITY = "flex_capacity"


@dataclass(frozen=True)
class Admit:
    wait: Wait | None = None


@dataclass(frozen=True)
class Refuse:
    reason: str
    retry_after: float  # seconds
    message: str


def _first_of_its_tenant(backlog: Backlog, new: Work) -> bool:
    """Whether `new` is its tenant's only interactive work, while the lane's tenants are fewer than the batch's
    rows (each then has a row by fair share, and its prompt goes first by its counter): a second key's lone
    client is never refused beside another key's crowd."""
    if new.lane is not Lane.INTERACTIVE:  # flex takes what interactive work leaves, whoever sends it
        return False
    lane = [w for w in backlog.work if w.lane == new.lane]
    if any(w.tenant == new.tenant for w in lane):
        return False
    return len({w.tenant for w in lane}) < backlog.cap


class AdmissionPolicy:
    def __init__(
        self,
        targets: LatencyTargets,
        *,
        weight: Callable[[str], float] = even,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.targets = targets
        self.weight = weight
        self.clock = clock
        self._factor = 1.0  # what first tokens took, over what the estimate said (a running mean)
        self._learned_at = clock()
        self._retry: dict[Lane, RetryQueue[Work]] = {lane: RetryQueue(clock) for lane in Lane}

    @property
    def factor(self) -> float:
        """What the estimate is scaled by now: the learned ratio, fading back to 1 without news."""
        fade = math.exp(-(self.clock() - self._learned_at) / FACTOR_MEMORY_SECONDS)
        return 1.0 + (self._factor - 1.0) * fade

    def learn(self, expected: float, actual: float) -> None:
        """An admitted request's first token came after `actual` seconds, where the estimate said `expected`:
        what the model of the worker leaves out (the event loop's own queue, the machine's other work) is
        counted in from now on."""
        if expected < LEARN_FROM_SECONDS:
            return
        low, high = FACTOR_BOUNDS
        ratio = min(high, max(low, actual / expected))
        self._factor = self.factor + FACTOR_SMOOTHING * (ratio - self.factor)
        self._learned_at = self.clock()

    def decide(self, backlog: Backlog, new: Work, key: Hashable | None = None) -> Admit | Refuse:
        """Admits `new` (the request `key`: a retry of a refused request has the same) or refuses it."""
        if new.lane is Lane.BATCH:
            return Admit()
        target = self.targets.ttft
        promised = self._retry[new.lane]
        # Clients told to come back before it: their room is kept (its own promise, if it is one of them, is its turn).
        ahead = promised.arrived(within=target, key=key)
        if ahead:
            backlog = dataclasses.replace(backlog, work=backlog.work + tuple(ahead))
        if _first_of_its_tenant(backlog, new):
            return Admit()  # fair share gives it a row at once, and its prompt goes first
        estimated = first_token(backlog, new, weight=self.weight)
        # What others add, scaled by what the estimate missed lately (the request's own time is its own).
        wait = Wait(estimated.alone + estimated.queued * max(1.0, self.factor), estimated.alone)
        allowed = max(ADMIT_SHARE * target - wait.alone, QUEUE_FLOOR * target)
        if wait.queued <= allowed:
            return Admit(estimated)
        retry_after = promised.after(wait.queued - allowed, backlog.interval, new, key)
        if new.lane is Lane.FLEX:
            message = "flex capacity is taken by other work now"
            reason = FLEX_CAPACITY
        else:
            message = "the server cannot start this request within its time-to-first-token target now"
            reason = FIRST_TOKEN_TARGET
        return Refuse(reason, retry_after, f"{message} ({target:.2f} s); retry after {retry_after:.2f} s")
