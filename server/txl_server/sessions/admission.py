"""The checks a new session or preloaded memory passes before any work is done for it.

A TTL within the server's bounds; for a session, its owner's session limit; and room on the device: a state that
could never run (its memory at its largest does not fit the device budget) is refused for good, one that does not
fit beside the states pinned by steps in flight is refused for now (retry shortly). Refusing up front means a
request never computes a state it cannot keep.
"""

from __future__ import annotations

from dataclasses import dataclass

from txl import TransfoXLLMHeadModel, peak_positions
from txl.window import WindowRule

from ..engine.worker import Worker
from ..errors import InvalidRequest, Overloaded
from ..settings import Settings
from .state_cache import DEVICE, StateCache
from .store.sessions import SessionStore


@dataclass(kw_only=True, eq=False)
class Admission:
    settings: Settings
    model: TransfoXLLMHeadModel
    worker: Worker
    cache: StateCache
    store: SessionStore

    def ttl(self, ttl_seconds: int | None) -> int:
        """The TTL asked for (the default if none), checked against the server's bounds."""
        ttl = self.settings.default_ttl_seconds if ttl_seconds is None else ttl_seconds
        if not 1 <= ttl <= self.settings.max_ttl_seconds:
            raise InvalidRequest(
                f"ttl_seconds must be between 1 and {self.settings.max_ttl_seconds}", param="ttl_seconds"
            )
        return ttl

    async def session(self, owner: str, mem_len: int) -> None:
        """The checks every new session passes (create, fork, import): the owner's session limit, and room for
        its memory on the device."""
        limit = self.settings.max_sessions_per_tenant
        # The index may still list expired sessions: count exactly (and prune) only when it matters.
        if await self.store.count(owner) >= limit and await self.store.count_exact(owner) >= limit:
            raise InvalidRequest(f"session limit reached ({limit}); delete some first")
        self.fits(mem_len)

    def fits(self, mem_len: int) -> None:
        """Refuses a state that could never run: its memory at its largest (full, with the room segment by
        segment ingestion keeps) does not fit the device budget."""
        per_position = self.model.memory_layout().bytes_per_position()
        held = WindowRule(mem_len, self.model.config.same_length, self.worker.grid).max_positions
        needed = peak_positions(held, self.worker.segment_len) * per_position
        if needed > self.cache.budget(DEVICE):
            raise Overloaded(
                f"a session with mem_len {mem_len} needs {needed} bytes, more than the device budget allows",
                retry_after=60,
            )
        if self.cache.pinned_bytes() + needed > self.cache.budget(DEVICE):
            raise Overloaded("no room for another session right now; retry shortly", retry_after=1)
