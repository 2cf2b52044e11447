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

import time
from collections.abc import Callable
from dataclasses import dataclass

from .classes import Lane
from .estimate import Backlog, Wait, Work, first_token
from .fair_share import even
from .retry import RetryQueue
from .targets import LatencyTargets

QUEUE_FLOOR = 0.25  # of the TTFT target: what a request may always wait for others, however long it is itself

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
        self._retry = {lane: RetryQueue(clock) for lane in Lane}

    def decide(self, backlog: Backlog, new: Work) -> Admit | Refuse:
        if new.lane is Lane.BATCH:
            return Admit()
        wait = first_token(backlog, new, weight=self.weight)
        target = self.targets.ttft
        allowed = max(target - wait.alone, QUEUE_FLOOR * target)
        if wait.queued <= allowed:
            return Admit(wait)
        retry_after = self._retry[new.lane].after(wait.queued - allowed, backlog.interval)
        if new.lane is Lane.FLEX:
            message = "flex capacity is taken by other work now"
            reason = FLEX_CAPACITY
        else:
            message = "the server cannot start this request within its time-to-first-token target now"
            reason = FIRST_TOKEN_TARGET
        return Refuse(reason, retry_after, f"{message} ({target:.2f} s); retry after {retry_after:.2f} s")
