"""Concurrency slots of the HTTP layer, per tenant: a request holds one from the moment its key is checked and its
body read until its answer (a stream: its last byte) is sent.

Three rules, in order:

- the server's ceiling (TXL_MAX_CONCURRENT_REQUESTS): `server_concurrency`;
- a tenant's own ceiling, if one is set (TXL_MAX_CONCURRENT_REQUESTS_PER_TENANT): `tenant_concurrency`;
- the last `reserve` free slots go only to a tenant below its fair share (the slots over the tenants holding some,
  plus one for a tenant yet to come): one tenant alone cannot take them all, and a tenant that arrives beside a
  crowd of another's always finds a slot, even for `GET /v1/models`: `tenant_share`.

A refusal's Retry-After is when a slot of the kind it lacks frees, on average (a slot is held for the measured
mean time; one of n held slots frees every mean / n seconds), spaced out between the clients refused
(`retry.RetryQueue`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from .retry import RetryQueue

SERVER_CONCURRENCY = "server_concurrency"
TENANT_CONCURRENCY = "tenant_concurrency"
TENANT_SHARE = "tenant_share"
HOLD_SMOOTHING = 0.05  # weight of each slot's hold time in the running mean
FIRST_HOLD_SECONDS = 1.0  # the mean before any slot was given back


@dataclass(frozen=True)
class SlotRefused:
    reason: str
    retry_after: float  # seconds
    message: str


class TenantSlots:
    def __init__(
        self,
        limit: int,
        *,
        per_tenant: int | None = None,
        reserve: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.per_tenant = per_tenant
        self.reserve = reserve
        self.clock = clock
        self.held: dict[str, int] = defaultdict(int)
        self.total = 0
        self.mean_hold = FIRST_HOLD_SECONDS
        self._retry: RetryQueue[None] = RetryQueue(clock)
        self._tenant_retry: dict[str, RetryQueue[None]] = {}

    def take(self, tenant: str) -> SlotRefused | None:
        """Takes a slot for `tenant`; or why not, and when to retry."""
        held = self.held.get(tenant, 0)
        if self.total >= self.limit:
            return self._refuse(
                SERVER_CONCURRENCY, self.total, None, f"{self.limit} requests in flight (the server's limit)"
            )
        if self.per_tenant is not None and held >= self.per_tenant:
            return self._refuse(
                TENANT_CONCURRENCY,
                held,
                tenant,
                f"{self.per_tenant} requests of this API key in flight (its limit)",
            )
        holders = sum(1 for t, n in self.held.items() if n > 0 and t != tenant) + 1
        fair = self.limit / (holders + 1)
        if self.limit - self.total <= self.reserve and held >= fair:
            return self._refuse(
                TENANT_SHARE,
                held,
                tenant,
                f"{held} requests of this API key in flight: the last {self.reserve} of the server's "
                f"{self.limit} slots are kept for other keys",
            )
        self.held[tenant] = held + 1
        self.total += 1
        return None

    def give_back(self, tenant: str, seconds: float) -> None:
        """`tenant`'s request ended after holding its slot `seconds`."""
        self.total -= 1
        self.held[tenant] -= 1
        if self.held[tenant] <= 0:
            del self.held[tenant]
            self._tenant_retry.pop(tenant, None)
        self.mean_hold += HOLD_SMOOTHING * (seconds - self.mean_hold)

    def _refuse(self, reason: str, holding: int, tenant: str | None, why: str) -> SlotRefused:
        interval = self.mean_hold / max(1, holding)  # one of `holding` slots frees this often, on average
        queue = (
            self._retry if tenant is None else self._tenant_retry.setdefault(tenant, RetryQueue(self.clock))
        )
        retry_after = queue.after(interval, interval, None)
        return SlotRefused(reason, retry_after, f"{why}; retry after {retry_after:.2f} s")
