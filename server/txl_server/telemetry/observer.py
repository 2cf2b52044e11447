"""The session observer a traced app gives its session service: the metrics' hooks, and what the request's trace
learns from them (where a fetched state came from, the tokens read and written)."""

from __future__ import annotations

from ..sessions.observer import SessionObserver
from .spans import tier_moved, tokens_counted


class TracedSessions(SessionObserver):
    """Passes every hook on to `inner` (the metrics), and tells the request's trace what it needs of them.
    (tests/server/telemetry: every hook of SessionObserver is passed on.)"""

    def __init__(self, inner: SessionObserver) -> None:
        self.inner = inner

    def on_tier_move(self, source: str, target: str) -> None:
        self.inner.on_tier_move(source, target)
        tier_moved(source, target)

    def on_conflict(self) -> None:
        self.inner.on_conflict()

    def on_tokens(self, kind: str, n: int) -> None:
        self.inner.on_tokens(kind, n)
        tokens_counted(kind, n)

    def on_prefix_cache(self, cached: int, total: int) -> None:
        self.inner.on_prefix_cache(cached, total)
