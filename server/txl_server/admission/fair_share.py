"""Fair share between tenants: a tenant with many requests cannot starve one with few.

Two measures, used where each fits:

- **Shares of the batch** (`max_min_shares`): the rows a decoding batch may hold are divided between the tenants
  that have rows to decode by weighted max-min fairness (water-filling): each tenant gets up to its weighted
  share, and what a tenant does not need goes to the others. A lone client of a second tenant thus always gets a
  row beside another tenant's crowd, at once. The division is sticky: a slot that the shares leave to one of two
  tenants stays with the one that holds it, so that rows do not change places at every step.
- **Virtual token counters** (`VirtualCounters`, the VTC of Sheng et al., "Fairness in Serving Large Language
  Models", OSDI 2024): each tenant's counter grows with the tokens it is served (divided by its weight), and the
  waiting work of the tenant with the smallest counter goes first (the scheduler orders prompt segments so). A
  tenant that comes back after being idle starts at the smallest counter of those waiting, so that it cannot
  spend a credit saved while it was away.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping


def even(_: str) -> float:
    """Every tenant weighs the same."""
    return 1.0


def max_min_shares(
    demand: Mapping[str, int],
    slots: int,
    *,
    weight: Callable[[str], float] = even,
    held: Mapping[str, int] | None = None,
    counters: Callable[[str], float] | None = None,
) -> dict[str, int]:
    """How many of `slots` each tenant gets, for its `demand`: weighted max-min fair, never more than it asks.

    Whole slots, handed out one at a time to the tenant furthest below its weighted share (fewest slots per
    weight); ties go to the tenant that `held` more of them before (sticky), then to the smallest counter
    (the tenant served least), then by name."""
    held = held or {}
    given = {tenant: 0 for tenant, wanted in demand.items() if wanted > 0}
    for _ in range(max(0, slots)):
        open_ = [t for t in given if given[t] < demand[t]]
        if not open_:
            break
        chosen = min(
            open_,
            key=lambda t: (
                given[t] / max(weight(t), 1e-9),
                -(held.get(t, 0) > given[t]),
                counters(t) if counters is not None else 0.0,
                t,
            ),
        )
        given[chosen] += 1
    return given


class VirtualCounters:
    """The service each tenant had, in tokens divided by its weight (VTC)."""

    def __init__(self, weight: Callable[[str], float] = even) -> None:
        self.weight = weight
        self._counters: dict[str, float] = {}

    def of(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def serve(self, tenant: str, tokens: int) -> None:
        """`tenant` was served `tokens` tokens (prompt tokens fed, or tokens generated)."""
        self._counters[tenant] = self.of(tenant) + tokens / max(self.weight(tenant), 1e-9)

    def join(self, tenant: str, waiting: Iterable[str]) -> None:
        """`tenant` has work again after having none: it starts no lower than the smallest counter of the
        tenants with work waiting (`waiting`), so that idle time is not a credit."""
        others = [self.of(t) for t in waiting if t != tenant]
        if others:
            self._counters[tenant] = max(self.of(tenant), min(others))

    def forget(self, keep: Iterable[str]) -> None:
        """Drops the counters of tenants not in `keep` once they no longer matter (none waiting: all equal)."""
        kept = set(keep)
        if not kept:
            self._counters.clear()
        elif len(self._counters) > 4 * len(kept) + 64:  # bounded, whatever the number of tenants seen
            self._counters = {t: c for t, c in self._counters.items() if t in kept}
