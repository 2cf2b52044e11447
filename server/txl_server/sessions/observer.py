"""Hooks through which the session layer reports what it did, for metrics (metrics.py implements them).

The defaults do nothing, so the session layer runs (and is tested) without metrics; every session part reports
through the one observer the service was given.
"""

from __future__ import annotations


class SessionObserver:
    """Hooks for metrics; the defaults do nothing."""

    def on_tier_move(self, source: str, target: str) -> None: ...

    def on_conflict(self) -> None: ...

    def on_tokens(self, kind: str, n: int) -> None: ...

    def on_prefix_cache(self, cached: int, total: int) -> None:
        """A prompt of `total` positions was read, `cached` of them from the prefix cache."""

    def on_store_loss(self, kind: str) -> None:
        """The session store (Redis) was found to have lost data: a session's latest `steps`, a whole `session`,
        or the whole store (`empty`, `older`, `replaced`)."""

    def on_outcome_unknown(self) -> None:
        """A change was sent to Redis, which did not answer: the step settles what happened (settling.py)."""

    def on_lease_lost(self) -> None:
        """A step lost its session's lease while it ran (it could not renew it): it was ended, nothing committed."""

    def on_unreplicated_commit(self) -> None:
        """A commit was answered before the replicas it waited for had it (Redis WAIT timed out)."""
