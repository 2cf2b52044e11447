"""Placement on its own (sessions/placement.py), with fakes for what it talks to (tests/helpers/session_fakes.py)
and real states in a real tiny pool: which session leaves which tier, in which order, and that no tier is ever over
its byte budget, not even between two moves."""

from __future__ import annotations

import asyncio
import time

import pytest
from txl_server.errors import Gone
from txl_server.sessions.placement import Placement, Released
from txl_server.sessions.prefix_cache import CachedBoundary, PrefixCache
from txl_server.sessions.recovery import Lost
from txl_server.sessions.state_cache import DEVICE, HOST, StateCache
from txl_server.settings import Settings

from tests.helpers import session_fakes as fakes
from tests.helpers.session_fakes import (
    FakeSessionStore,
    FakeWorker,
    Recorder,
    meta,
    state,
    state_bytes,
    summary,
)
from tests.helpers.states import same_state

ONE = state_bytes(8)  # a session of 8 positions: two blocks and its last hidden state


class CheckedCache(StateCache):
    """The state cache, checking both tiers' budgets after every change placement makes to it."""

    def _check(self) -> None:
        for tier in (DEVICE, HOST):
            assert self.used(tier) <= self.budget(tier), f"{tier} over its budget"

    def put(self, *args, **kwargs) -> None:
        super().put(*args, **kwargs)
        self._check()

    def replace(self, *args, **kwargs) -> None:
        super().replace(*args, **kwargs)
        self._check()


class Persisting:
    """Persistence as placement uses it: saving a session that leaves (`gate`: held until set), reading one
    back (`held`: id -> positions Redis holds)."""

    def __init__(self, mode: str, worker: FakeWorker) -> None:
        self.enabled, self.always = mode != "none", mode == "always"
        self.worker = worker
        self.saved: list[str] = []
        self.held: dict[str, int] = {}
        self.gate = asyncio.Event()
        self.gate.set()

    async def save(self, session_id, entry, *, then) -> None:
        await self.gate.wait()
        self.saved.append(session_id)
        await then()

    async def read(self, session):
        positions = self.held.get(session.id)
        return None if positions is None else state(self.worker.pool, positions)


class Missing:
    async def missing(self, session):
        return Gone(f"{session.id} lost", param="session_id")


class Tiers:
    """A placement over fakes, and the fakes."""

    def __init__(self, *, device: int, host: int = 0, mode: str = "evict", blocks: int = 64, growable=True):
        self.worker = FakeWorker(fakes.pool(blocks, growable=growable))
        self.cache = CheckedCache(device_budget=device, host_budget=host)
        self.prefix_cache = PrefixCache(budget_bytes=10_000, grid=fakes.BLOCK, salt="test")
        self.store = FakeSessionStore()
        self.persistence = Persisting(mode, self.worker)
        self.observer = Recorder()
        self.placement = Placement(
            settings=Settings(keep_versions=3),
            worker=self.worker,
            cache=self.cache,
            prefix_cache=self.prefix_cache,
            store=self.store,
            persistence=self.persistence,
            recovery=Missing(),
            observer=self.observer,
        )

    async def place(self, session_id: str, positions: int = 8, *, version: int = 1, **fields) -> None:
        session = self.store.put(meta(session_id, version=version, **fields))
        placed = state(self.worker.pool, positions)
        await self.placement.place(session, placed, summary=summary(version))
        placed.release()  # the cache holds its own

    def where(self) -> dict[str, str]:
        return {sid: self.cache.peek(sid).tier for sid in reversed(self.cache.most_recent_first())}


async def test_placing_pushes_the_least_recently_used_down_the_tiers_device_host_then_out():
    t = Tiers(device=2 * ONE, host=2 * ONE)
    for sid in ("s1", "s2", "s3", "s4", "s5"):
        await t.place(sid)
    assert t.where() == {"s2": HOST, "s3": HOST, "s4": DEVICE, "s5": DEVICE}
    assert t.persistence.saved == ["s1"]  # out of the process: written to Redis
    assert t.observer.moves == [(DEVICE, HOST)] * 2 + [(HOST, "redis"), (DEVICE, HOST)]
    assert ("s1", "redis") in t.store.tiers and ("s3", HOST) in t.store.tiers
    assert t.cache.used(DEVICE) == t.cache.used(HOST) == 2 * ONE


async def test_without_a_host_tier_sessions_leave_the_device_straight_out_of_the_process():
    t = Tiers(device=2 * ONE, host=0)
    for sid in ("s1", "s2", "s3"):
        await t.place(sid)
    assert t.where() == {"s2": DEVICE, "s3": DEVICE}
    assert t.persistence.saved == ["s1"] and t.observer.moves == [(DEVICE, "redis")]


async def test_a_session_that_moved_up_again_is_no_longer_the_first_to_go():
    t = Tiers(device=2 * ONE)
    await t.place("s1")
    await t.place("s2")
    t.cache.get("s1")  # used: s2 is now the least recently used
    await t.place("s3")
    assert t.where() == {"s1": DEVICE, "s3": DEVICE} and t.persistence.saved == ["s2"]


async def test_older_versions_leave_the_device_before_any_sessions_newest():
    t = Tiers(device=3 * ONE)
    await t.place("s1", version=1)
    await t.place("s1", version=2)  # keeps version 1 beside it (TXL_KEEP_VERSIONS=3)
    await t.place("s2")
    assert list(t.cache.peek("s1").older) == [1] and t.cache.used(DEVICE) == 3 * ONE
    await t.place("s3")
    assert t.where() == {"s1": DEVICE, "s2": DEVICE, "s3": DEVICE}
    assert t.cache.peek("s1").older == {} and t.persistence.saved == []
    assert [s.version for s in t.cache.peek("s1").summaries] == [1, 2]  # still listed: Redis may hold it


async def test_a_session_with_a_step_in_flight_is_never_chosen():
    t = Tiers(device=2 * ONE)
    await t.place("s1")
    await t.place("s2")
    t.cache.pin("s1")  # least recently used, but a step holds it
    await t.place("s3")
    assert t.where() == {"s1": DEVICE, "s3": DEVICE} and t.persistence.saved == ["s2"]
    t.cache.unpin("s1")
    await t.place("s4")
    assert "s1" not in t.where()


@pytest.mark.parametrize(
    ("mode", "saved", "tier", "gone"),
    [("evict", ["s1"], "redis", ""), ("always", [], "redis", ""), ("none", [], None, Lost.EVICTED)],
)
async def test_a_session_pushed_out_is_written_kept_or_marked_gone_by_the_persistence_mode(
    mode, saved, tier, gone
):
    t = Tiers(device=ONE, mode=mode)
    await t.place("s1")
    await t.place("s2")
    assert "s1" not in t.cache and t.persistence.saved == saved  # `always` wrote it at its commit
    assert (("s1", tier) in t.store.tiers) == (tier is not None)
    assert t.store.sessions["s1"].gone == gone  # persistence none: its memory is lost, and it says why
    assert t.observer.moves == [(DEVICE, tier or "gone")]


async def test_a_session_leaves_the_cache_only_once_redis_holds_it():
    t = Tiers(device=ONE)
    await t.place("s1")
    t.persistence.gate.clear()  # the write to Redis is under way
    placing = asyncio.ensure_future(t.place("s2"))
    await asyncio.sleep(0.05)
    assert "s1" in t.cache and not placing.done()
    t.persistence.gate.set()
    await placing
    assert t.where() == {"s2": DEVICE} and t.persistence.saved == ["s1"]


async def test_fetch_serves_the_device_copy_and_brings_a_host_copy_back_on_the_worker():
    t = Tiers(device=ONE, host=ONE)
    await t.place("s1")
    resident = t.cache.peek("s1").state
    fetched = await t.placement.fetch(t.store.sessions["s1"])  # the caller's own hold on the cached state
    assert same_state(fetched, resident) and fetched is not resident and t.worker.calls == 0
    fetched.release()
    await t.place("s2")  # s1 down to the host
    assert t.where() == {"s1": HOST, "s2": DEVICE}
    fetched = await t.placement.fetch(t.store.sessions["s1"])
    assert t.worker.calls == 1  # the device's pool is written on the worker's thread
    assert fetched.memory.pool is t.worker.pool and t.where() == {"s2": HOST, "s1": DEVICE}
    assert fetched.memory.keys(0).tolist() == resident.memory.keys(0).tolist()
    assert t.observer.moves[-2:] == [(DEVICE, HOST), (HOST, DEVICE)]


async def test_fetch_reads_redis_for_a_version_this_process_does_not_hold_and_never_serves_a_stale_copy():
    t = Tiers(device=4 * ONE)
    await t.place("s1", version=1)
    newer = t.store.put(meta("s1", version=2))  # another replica committed version 2
    t.persistence.held["s1"] = 12
    fetched = await t.placement.fetch(newer)
    assert fetched.memory.length == 12 and t.cache.peek("s1").version == 2
    assert t.observer.moves == [("redis", DEVICE)]


async def test_fetch_answers_why_a_state_it_cannot_find_is_lost():
    t = Tiers(device=ONE)
    with pytest.raises(Gone, match="s1 lost"):  # neither here nor in Redis: recovery says why
        await t.placement.fetch(t.store.put(meta("s1")))
    await t.place("s2")
    with pytest.raises(Gone):
        await t.placement.fetch(t.store.put(meta("s2", tier="gone", gone=Lost.CRASHED)))
    assert "s2" not in t.cache


async def test_a_pool_that_cannot_grow_gets_its_blocks_back_prefix_cache_first_then_idle_sessions():
    t = Tiers(device=100 * ONE, blocks=9, growable=False)  # 8 blocks: three sessions of two, and one spare
    for sid in ("s1", "s2", "s3"):
        await t.place(sid)
    t.prefix_cache.put("k", CachedBoundary(state(t.worker.pool, 4), [0.0] * 4))
    assert t.worker.pool.available_blocks == 1
    t.worker.on_pool_pressure(4)  # from the worker's thread: "I lack 4 free blocks"
    deadline = time.monotonic() + 5
    while t.worker.pool.available_blocks < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert len(t.prefix_cache) == 0 and t.persistence.saved == ["s1"]
    assert t.where() == {"s2": DEVICE, "s3": DEVICE} and t.worker.pool.available_blocks == 4


async def test_expired_sessions_are_freed_and_extended_ones_kept():
    t = Tiers(device=4 * ONE)
    past = time.time() - 100
    await t.place("gone-by", last_used=past, ttl_seconds=10)
    await t.place("renewed", last_used=past, ttl_seconds=10)
    del t.store.sessions["gone-by"]  # Redis dropped it when its TTL ran out
    t.store.put(meta("renewed", last_used=time.time(), ttl_seconds=10))  # another replica used it since
    assert await t.placement.reap_expired() == 1
    assert list(t.where()) == ["renewed"] and await t.placement.reap_expired() == 0


@pytest.mark.parametrize(
    ("mode", "seconds_left", "released", "gone"),
    [
        ("evict", 60, Released(saved=3, lost=0), ""),
        ("evict", -1, Released(saved=0, lost=3), Lost.UNSAVED),
        ("none", 60, Released(saved=0, lost=3), Lost.RESTARTED),
        ("always", 60, Released(saved=0, lost=0), ""),
    ],
)
async def test_at_shutdown_what_only_this_process_holds_is_saved_most_recent_first_or_marked_gone(
    mode, seconds_left, released, gone
):
    t = Tiers(device=4 * ONE, mode=mode)
    for sid in ("s1", "s2", "s3"):
        await t.place(sid)
    assert await t.placement.release_all(time.monotonic() + seconds_left) == released
    assert t.persistence.saved == (["s3", "s2", "s1"] if released.saved else [])
    assert {s.gone for s in t.store.sessions.values()} == {gone}
