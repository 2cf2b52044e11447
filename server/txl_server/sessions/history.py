"""Session history: the versions a session keeps, going back to one (rewind), and reading any of them.

A step never changes the memory it started from (txl.memory), so an old version is a block table and a hidden
state sharing their blocks with the newer ones: keeping `TXL_KEEP_VERSIONS` of them costs only the blocks they do
not share. With persistence `always` (the default) Redis holds them (store/blocks.py: every version lists its
blocks), so they survive restarts and any replica reads them; the device keeps recent ones too, for a rewind
without a read. With `evict` or `none`, versions live in this process only, while the session is on the device.

A rewind is itself a committed step, a new and higher version holding an old version's memory: history is never
lost, and a rewind is undone by another rewind. Since a session's state is a function of its tokens (txl.window),
what follows a rewind to N, or a fork at N, is exactly what follows a fresh session fed N's text.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.state import ModelState
from ..errors import NotFound
from .persistence import Persistence
from .placement import Placement
from .recovery import Recovery
from .step import ReceiptOf, Steps
from .store.sessions import SessionMeta, SessionStore
from .store.versions import BlocksMissing, VersionSummary


@dataclass(kw_only=True, eq=False)
class SessionHistory:
    recovery: Recovery
    steps: Steps
    placement: Placement
    persistence: Persistence
    store: SessionStore

    async def versions(self, owner: str, session_id: str) -> list[VersionSummary]:
        """The session's kept versions, newest first."""
        meta = await self.recovery.get(owner, session_id)
        return list(reversed(await self._kept(meta)))

    async def _kept(self, meta: SessionMeta) -> list[VersionSummary]:
        """Oldest first: from Redis where it keeps them, else from this process (the newest at least)."""
        if self.persistence.always:
            stored = await self.store.versions(meta.id)
            if stored and stored[-1].version == meta.version:
                return stored
        entry = self.placement.cache.peek(meta.id)
        if entry is not None and entry.version == meta.version and entry.summaries:
            return list(entry.summaries)
        return [VersionSummary(meta.version, meta.tokens, meta.last_used, "append")]

    async def state_at(self, meta: SessionMeta, version: int) -> tuple[ModelState, VersionSummary]:
        """Version `version` of the session: its state, on the device (the caller's hold), and its summary. NotFound
        (code `version_not_found`, naming the oldest kept version) if it is not kept."""
        kept = await self._kept(meta)
        summary = next((s for s in kept if s.version == version), None)
        if summary is not None and version == meta.version:
            return await self.placement.fetch(meta), summary
        entry = self.placement.cache.peek(meta.id)
        if summary is not None and entry is not None and entry.version == meta.version:
            older = entry.older.get(version)
            if older is not None:
                return older.retain(), summary
        if summary is not None and self.persistence.always:
            try:
                stored = await self.store.load_version(meta.id, version)
            except BlocksMissing:
                stored = None
            if stored is not None:
                try:
                    return await self.persistence.restore(stored), summary
                except ValueError:
                    pass
        oldest = kept[0].version if kept else meta.version
        raise NotFound(
            f"version {version} of session {meta.id!r} is not kept; the oldest kept version is {oldest}",
            param="version",
            code="version_not_found",
        )

    async def rewind(
        self, owner: str, session_id: str, version: int, *, receipt: ReceiptOf | None = None
    ) -> SessionMeta:
        """The session continues from version `version`'s memory, as a new version (kind "rewind"); `receipt`:
        the Idempotency-Key's record of it, written with the commit."""
        async with self.steps.hold(owner, session_id) as (meta, _, lease):
            state, summary = await self.state_at(meta, version)
            return await self.steps.commit(
                meta,
                state,
                summary.tokens,
                lease=lease,
                kind="rewind",
                text=summary.text_tail,
                receipt=receipt,
            )
