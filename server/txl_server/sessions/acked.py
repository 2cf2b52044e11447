"""What this process acknowledged: each session's newest version it committed (and told a client about), so that a
Redis that came back older or empty is noticed, never continued from.

Redis is the authority on a session's version, but a Redis restarted from an older snapshot, one that lost its
last second of append-only file, or a replica promoted before it caught up, holds older versions than clients were
told, and one restarted empty holds none. Continuing from there would reuse version numbers (and response ids)
for different text. This process remembers the versions it acknowledged (the most recently used sessions, up to
`capacity`), and recovery.py answers a session Redis holds behind them `410` (code `store_lost_steps`), or one
Redis lost whole `410` (code `store_lost_session`), and marks it so in Redis for every replica.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

from .store.plumbing import now
from .store.sessions import SessionMeta

DEFAULT_CAPACITY = 50_000  # sessions remembered, ~0.4 KiB each
# A session within this long of its expiry may have expired in Redis already (clocks differ a little).
EXPIRY_MARGIN_SECONDS = 5.0


class AckedVersions:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._acked: OrderedDict[str, SessionMeta] = OrderedDict()  # least recently acknowledged first

    def __len__(self) -> int:
        return len(self._acked)

    def note(self, meta: SessionMeta) -> None:
        """`meta`'s version was committed and acknowledged."""
        known = self._acked.get(meta.id)
        if known is None or known.version <= meta.version:
            self._acked[meta.id] = dataclasses.replace(meta, metadata={})  # the metadata is not needed
        self._acked.move_to_end(meta.id)
        while len(self._acked) > self.capacity:
            self._acked.popitem(last=False)

    def forget(self, session_id: str) -> None:
        """The session was deleted (or expired): nothing to hold Redis to."""
        self._acked.pop(session_id, None)

    def behind(self, meta: SessionMeta) -> SessionMeta | None:
        """What this process acknowledged of `meta`'s session, if Redis holds an older version than that."""
        known = self._acked.get(meta.id)
        return known if known is not None and known.version > meta.version else None

    def lost(self, session_id: str) -> SessionMeta | None:
        """What this process acknowledged of a session Redis does not hold at all, if it cannot have expired
        since (Redis lost it: restarted empty, evicted it, or failed over to a replica that never had it)."""
        known = self._acked.get(session_id)
        if known is None or known.expires_at - EXPIRY_MARGIN_SECONDS <= now():
            return None
        return known
