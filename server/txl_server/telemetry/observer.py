"""The session observer a traced app gives its session service: the metrics' hooks, and what the request's trace
learns from them (where a fetched state came from, the tokens read and written)."""

from __future__ import annotations

import inspect

from ..sessions.observer import SessionObserver
from .spans import tier_moved, tokens_counted


class TracedSessions(SessionObserver):
    """Every hook goes on to `inner` (the metrics); the two the trace needs are also told to it. The others are
    `inner`'s own methods, set on this object when it is made, so that a hook added to SessionObserver later
    reaches the metrics without a line here."""

    def __init__(self, inner: SessionObserver) -> None:
        self.inner = inner
        for name, _ in inspect.getmembers(SessionObserver, inspect.isfunction):
            if not name.startswith("_") and name not in TracedSessions.__dict__:
                setattr(self, name, getattr(inner, name))

    def on_tier_move(self, source: str, target: str) -> None:
        self.inner.on_tier_move(source, target)
        tier_moved(source, target)

    def on_tokens(self, kind: str, n: int) -> None:
        self.inner.on_tokens(kind, n)
        tokens_counted(kind, n)
