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
