"""Retry-After, computed: how long a refused client should wait to be served on its next try.

Two parts. The **wait**: how long until the work ahead has drained enough for a request like this one to be
admitted (the caller computes it from its own queue: `policy`, `slots`). The **spacing**: refused clients are not
all sent back to the same moment (where one would be served and the rest refused again), but one after the other,
as fast as the server makes room (the measured interval between two jobs ending): each refusal is told the first
free moment of a virtual queue of promised retries, no earlier than its own wait. Promises in the past cost
nothing: a client that does not come back leaves no debt.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

MAX_RETRY_AFTER_SECONDS = 60.0  # a bound on what any estimate may tell a client


class RetryQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last = -math.inf  # the latest moment promised

    def after(self, wait: float, interval: float) -> float:
        """Seconds the next refused client should wait: at least `wait`, and `interval` after the previous
        promise."""
        now = self.clock()
        at = max(now + max(0.0, wait), self._last + max(0.0, interval))
        at = min(at, now + MAX_RETRY_AFTER_SECONDS)
        self._last = at
        return at - now


def header_values(seconds: float) -> dict[str, str]:
    """The headers of a refusal: Retry-After in whole seconds (HTTP's unit: rounded up, at least 1), and
    retry-after-ms exactly (which OpenAI's SDKs read first)."""
    return {
        "Retry-After": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(max(1, round(seconds * 1000))),
    }
