"""Placement: where each session's state lives (device, host, Redis, or lost), within every tier's budget.

A state a step needs is brought to the device (`fetch`: from the host tier, or read back from Redis); a state
placed on the device first pushes least recently used sessions down (device -> host -> Redis or gone), so that no
tier goes over its budget, even for a moment. Older versions a session keeps on the device go before any
session's newest. The worker's pool never grows: when it lacks free blocks it asks for relief (`on_pool_pressure`)
and idle sessions leave the device. At shutdown, what only this process holds is saved or marked gone
(`release_all`).

The state cache (state_cache.py) keeps the books; this module moves the tensors (off the event loop, or on the
worker's thread for the device's pool) and records every move in Redis. All moves hold one lock (the tier lock):
budgets are counted between moves, never during one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from txl import BlockPool

from ..engine.state import ModelState
from ..engine.worker import Worker
from ..settings import Settings
from ..telemetry.spans import traced
from .observer import SessionObserver
from .persistence import Persistence
from .prefix_cache import PrefixCache
from .recovery import Lost, Recovery, gone_error
from .state_cache import DEVICE, HOST, Entry, StateCache
from .store.plumbing import now
from .store.sessions import SessionMeta, SessionStore
from .store.versions import VersionSummary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Released:
    """What a shutdown did with the sessions only this process held."""

    saved: int  # written to Redis
    lost: int  # marked gone (persistence none, or no time left)


@dataclass(kw_only=True, eq=False)
class Placement:
    settings: Settings
    worker: Worker
    cache: StateCache
    prefix_cache: PrefixCache  # it gives its blocks back first when the pool runs short
    store: SessionStore
    persistence: Persistence
    recovery: Recovery
    observer: SessionObserver

    def __post_init__(self) -> None:
        # The device's pool is the worker's; sessions moved off the device go to a pool of host RAM, written
        # only under the tier lock.
        self.pool = self.worker.pool
        self.host_pool = BlockPool(
            self.pool.layout.on(device="cpu"),
            block_size=self.pool.block_size,
            keep_hidden=self.pool.keep_hidden,
        )
        self._tier_lock = asyncio.Lock()
        self._expiry: dict[str, float] = {}  # id -> when its TTL runs out (sessions and memories held here)
        self._loop = asyncio.get_running_loop()
        self._relieving = False
        self.worker.on_pool_pressure = self.on_pool_pressure

    # ------------------------------------------------------------------ to the device

    @traced("session.fetch", {"txl.session.source": DEVICE})  # else the tier it came from (on_tier_move)
    async def fetch(self, meta: SessionMeta) -> ModelState:
        """The session's state at its committed version, brought to the device tier: the caller's hold, which it
        releases when done (the cache keeps its own)."""
        if meta.tier == "gone":
            self.cache.drop(meta.id)
            raise gone_error(meta.gone)
        entry = self.cache.get(meta.id)
        if entry is not None and entry.version == meta.version:
            if entry.tier == HOST:
                # Writing the device's pool is the worker's: between its iterations.
                moved = await self.worker.call(lambda: entry.state.moved(self.pool))
                return await self._placed(meta, moved, HOST)
            return entry.state.retain()
        if entry is not None:  # a stale copy (another replica committed since): never served
            self.cache.drop(meta.id)
        state = await self.persistence.read(meta)
        if state is None:
            raise await self.recovery.missing(meta)
        return await self._placed(meta, state, "redis")

    async def _placed(self, meta: SessionMeta, state: ModelState, source: str) -> ModelState:
        """`state` (the caller's), placed on the device: or released if that fails."""
        try:
            await self.place(meta, state, source=source)
        except BaseException:
            state.release()
            raise
        return state

    async def place(
        self,
        meta: SessionMeta,
        state: ModelState,
        *,
        source: str | None = None,
        summary: VersionSummary | None = None,
    ) -> None:
        """Puts a session's state on the device tier, first moving least recently used sessions down so that no
        tier goes over its budget. A new version (`summary`) keeps the versions before it that the device holds,
        up to TXL_KEEP_VERSIONS. The cache takes its own hold of `state`: the caller keeps theirs."""
        keep = max(1, self.settings.keep_versions)
        async with self._tier_lock:
            if summary is not None and await self._advance(meta, state, summary, keep):
                return
            previous = self.cache.take(meta.id)  # its previous state's bytes are free now
            try:
                await self._put(meta, state, summary, keep, previous)
            finally:
                if previous is not None:  # what the new entry keeps of it, it holds again
                    previous.release()
        if source is not None:
            self.observer.on_tier_move(source, DEVICE)
            await self._set_tier(meta.id, DEVICE)

    async def _put(
        self,
        meta: SessionMeta,
        state: ModelState,
        summary: VersionSummary | None,
        keep: int,
        previous: Entry | None,
    ) -> None:
        """The new entry of `place`, with what it keeps of `previous`'s versions. Holds the lock."""
        older: dict[int, ModelState] = {}
        summaries = list(previous.summaries) if previous is not None else []
        if summary is not None:
            if previous is not None and previous.version == meta.version - 1:
                older = dict(previous.older)
                if previous.tier == DEVICE:
                    older[previous.version] = previous.state
            else:
                summaries = []
            summaries = [*summaries, summary][-keep:]
        kept = {s.version for s in summaries}
        older = {v: s for v, s in older.items() if v in kept}
        await self._make_room(DEVICE, self.cache.added_bytes(DEVICE, state, *older.values()))
        self.cache.put(meta.id, state, meta.version, DEVICE, older=older, summaries=summaries)
        self._expiry[meta.id] = meta.expires_at

    async def _advance(
        self, meta: SessionMeta, state: ModelState, summary: VersionSummary, keep: int
    ) -> bool:
        """A commit's new version, where the device holds the version before: only its new blocks are counted
        in (and room made for them). False where that is not so. Holds the lock."""
        previous = self.cache.peek(meta.id)
        if previous is None or previous.tier != DEVICE or previous.version != meta.version - 1:
            return False
        await self._make_room(DEVICE, self.cache.added_bytes(DEVICE, state))
        summaries = [*previous.summaries, summary][-keep:]
        if not self.cache.advance(meta.id, state, meta.version, summaries):
            return False  # it changed while room was made: placed from scratch
        self._expiry[meta.id] = meta.expires_at
        return True

    async def place_memory(self, memory_id: str, state: ModelState, expires_at: float) -> None:
        """Puts a preloaded memory's state on the device tier (version 1 for its whole life), making room as for a
        session."""
        async with self._tier_lock:
            self.cache.drop(memory_id)
            await self._make_room(DEVICE, self.cache.added_bytes(DEVICE, state))
            self.cache.put(memory_id, state, 1, DEVICE)
            # The expiry sweep drops it from the cache once its time is up (it finds no session of that id).
            self._expiry[memory_id] = expires_at

    # ------------------------------------------------------------------ down the tiers

    async def _make_room(self, tier: str, needed: int) -> None:
        """Moves victims out of `tier` until `needed` more bytes fit (or nothing else can move). Holds the lock."""
        while self.cache.used(tier) + needed > self.cache.budget(tier):
            if self.cache.drop_older(tier):  # older versions go before any session's newest
                continue
            victim = self.cache.victim(tier)
            if victim is None:
                return
            await self._move_down(victim, tier)

    async def _move_down(self, victim: str, tier: str) -> None:
        """Moves one session out of `tier`: from the device to the host if the host has room, else out of this
        process. Holds the lock."""
        entry = self.cache.peek(victim)
        assert entry is not None
        if tier == DEVICE and self.cache.budget(HOST) > 0:  # none on a CPU by default: no copy for nothing
            moved = await asyncio.to_thread(entry.state.moved, self.host_pool)
            try:
                host_needs = self.cache.added_bytes(HOST, moved)
                await self._make_room(HOST, host_needs)
                if self.cache.peek(victim) is not entry:  # changed while we copied: the caller looks again
                    return
                if self.cache.used(HOST) + host_needs <= self.cache.budget(HOST):
                    self.cache.replace(victim, moved, HOST)  # its own hold: the device's copy is released
                    self.observer.on_tier_move(DEVICE, HOST)
                    await self._set_tier(victim, HOST)
                    return
            finally:
                moved.release()
        await self.spill(victim, entry)

    def on_pool_pressure(self, blocks: int) -> None:
        """The worker (on its thread) lacks `blocks` free blocks of a pool that never grows: idle sessions leave
        the device until it has them (one relief at a time)."""
        if not self._relieving:
            self._relieving = True
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._relieve_pool(blocks)))

    async def _relieve_pool(self, blocks: int) -> None:
        try:
            async with self._tier_lock:
                while self.pool.available_blocks < blocks:
                    if self.prefix_cache.evict_one() or self.cache.drop_older(DEVICE):
                        continue
                    victim = self.cache.victim(DEVICE)
                    if victim is None:
                        return
                    await self._move_down(victim, DEVICE)
        except Exception as exc:  # Redis away while spilling: the worker asks again
            log.warning("could not move sessions off the device: %s", exc)
        finally:
            self._relieving = False

    async def spill(self, victim: str, entry: Entry, *, lost: Lost = Lost.EVICTED) -> None:
        """Out of this process: to Redis (persistence on), else dropped: the session is marked gone for `lost`
        (it answers 410 saying so, and is no longer listed)."""
        if not self.persistence.enabled:
            await self._leave(victim, entry, "gone", lost)
        elif self.persistence.always:  # "always" already wrote this version at commit
            await self._leave(victim, entry, "redis", lost)
        else:  # written to Redis first, then it leaves
            await self.persistence.save(victim, entry, then=lambda: self._leave(victim, entry, "redis", lost))

    async def _leave(self, victim: str, entry: Entry, target: str, lost: Lost) -> None:
        """The entry leaves this process for `target` (Redis, or gone for `lost`), unless it changed meanwhile."""
        if self.cache.peek(victim) is entry:
            self.cache.drop(victim)
            self.observer.on_tier_move(entry.tier, target)
            if target == "gone":
                await self._mark_gone(victim, entry.version, lost)
            else:
                await self._set_tier(victim, target)

    async def _mark_gone(self, session_id: str, version: int, lost: Lost) -> None:
        with contextlib.suppress(Exception):  # Redis away: start-up reconciliation will find it
            meta = await self.store.get(session_id)
            if meta is not None and meta.version == version:
                await self.store.mark_gone(meta, lost)

    async def _set_tier(self, session_id: str, tier: str) -> None:
        with contextlib.suppress(Exception):  # bookkeeping only: a session's truth is its version
            await self.store.touch_tier(session_id, tier)

    # ------------------------------------------------------------------ out of this process

    def forget(self, state_id: str) -> None:
        """Drops this process's copy of a session's or a preloaded memory's state (deleted, or found gone)."""
        self.cache.drop(state_id)
        self._expiry.pop(state_id, None)

    def extend(self, state_id: str, expires_at: float) -> None:
        """A state held here now expires at `expires_at` (its TTL was set again)."""
        if state_id in self._expiry:
            self._expiry[state_id] = expires_at

    async def reap_expired(self) -> int:
        """Frees the memory of sessions whose TTL ran out (Redis already dropped their metadata)."""
        stamp = now()
        freed = 0
        for session_id, expires_at in list(self._expiry.items()):
            if expires_at > stamp:
                continue
            meta = await self.store.get(session_id)
            if meta is None:
                self.cache.drop(session_id)
                self._expiry.pop(session_id, None)
                freed += 1
            else:
                self._expiry[session_id] = meta.expires_at
        return freed

    async def release_all(self, deadline: float) -> Released:
        """At shutdown: the sessions whose memory only this process holds are saved to Redis (persistence
        `evict`), most recently used first, until `deadline` (time.monotonic()); those left, and all of them
        with persistence `none`, are marked gone with the reason. With `always` Redis holds them already."""
        saved = marked = 0
        if self.persistence.always:
            return Released(saved=0, lost=0)
        async with self._tier_lock:
            for session_id in self.cache.most_recent_first():
                entry = self.cache.peek(session_id)
                if entry is None:
                    continue
                if not self.persistence.enabled:
                    lost: Lost | None = Lost.RESTARTED
                elif time.monotonic() >= deadline:
                    lost = Lost.UNSAVED
                else:
                    lost = None
                try:
                    if lost is None:
                        await self.spill(session_id, entry)
                        saved += 1
                    else:
                        self.cache.drop(session_id)
                        await self._mark_gone(session_id, entry.version, lost)
                        marked += 1
                except Exception as exc:  # Redis away: start-up reconciliation marks what is lost
                    log.warning("could not save session memory at shutdown: %s", exc)
        return Released(saved=saved, lost=marked)
