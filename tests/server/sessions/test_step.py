"""The atomic step on its own (sessions/step.py), over fakes (tests/helpers/session_fakes.py): a commit writes the
next version under the step's lease and only then places it; a step that fails, loses its lease or is refused
leaves the session as it was; a commit once begun runs to its end; a lease lost mid-step ends the step at once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from txl_server.engine.jobs import AdvanceJob
from txl_server.errors import Conflict, Gone, InvalidRequest, NotFound, OutcomeUnknown, Unavailable
from txl_server.sessions.recovery import Lost, Recovery, Replica
from txl_server.sessions.state_cache import StateCache
from txl_server.sessions.step import Steps
from txl_server.sessions.store.sessions import Fenced, SessionGone
from txl_server.sessions.store.versions import VersionWrite
from txl_server.settings import Persistence as Mode
from txl_server.settings import Settings

from tests.helpers import session_fakes as fakes
from tests.helpers.session_fakes import (
    FakeHeartbeats,
    FakeLeases,
    FakeSessionStore,
    FakeWorker,
    Recorder,
    meta,
    state,
    summary,
)

ME = Replica("me", "1")


class Placing:
    """Placement as a step uses it: `fetch` gives the state, `place` records what Redis held when it placed."""

    def __init__(self, worker: FakeWorker, store: FakeSessionStore) -> None:
        self.worker, self.store = worker, store
        self.cache = StateCache(device_budget=1 << 20, host_budget=0)
        self.placed: list[tuple[str, int, int]] = []  # (id, version placed, version Redis held then)

    async def fetch(self, session):
        st = state(self.worker.pool, 8)
        self.cache.put(session.id, st, session.version)
        return st

    async def place(self, session, st, *, summary=None):
        self.placed.append((session.id, session.version, self.store.sessions[session.id].version))
        self.cache.put(session.id, st, session.version)

    def pinned(self) -> bool:
        return self.cache.pinned_bytes() > 0


class Stepping(fakes.Stored):
    def __init__(self, *, mode: Mode = Mode.ALWAYS, ttl: float = 10.0, limit: int = 1000) -> None:
        settings = Settings(
            persistence=mode, lease_ttl_seconds=ttl, lease_wait_seconds=0, max_sessions_per_tenant=limit
        )
        super().__init__(settings)
        self.leases = FakeLeases(self.store, holder=ME.id)
        self.placement = Placing(self.worker, self.store)
        self.observer = Recorder()
        stores = SimpleNamespace(sessions=self.store, leases=self.leases, heartbeats=FakeHeartbeats())
        self.recovery = Recovery(stores, me=ME, exclusive=True, observer=self.observer)
        self.steps = Steps(
            settings=settings,
            worker=self.worker,
            store=self.store,
            leases=self.leases,
            placement=self.placement,
            persistence=self.persistence,
            recovery=self.recovery,
            observer=self.observer,
            holder=ME.id,
        )
        self.store.put(meta("s1", version=1))

    async def append(self, text: str = "more") -> object:
        """One step on s1, as SessionService.append runs it."""
        async with self.steps.hold("alice", "s1") as (session, st, lease):
            job = AdvanceJob(st, list(text.encode()))
            result = await self.steps.run(job, lease)
            return await self.steps.commit(
                session, result.state, session.tokens + 4, lease=lease, kind="append", text=text
            )


async def test_a_commit_writes_the_next_version_under_the_lease_and_only_then_places_it():
    s = Stepping()
    async with s.steps.hold("alice", "s1") as (session, st, lease):
        assert s.placement.pinned()  # held on the device while the step runs
        new = await s.steps.commit(session, st, 12, lease=lease, kind="append", text="hello")
    assert (new.version, new.tokens, new.holder) == (2, 12, ME.id)
    assert s.store.sessions["s1"] == new and s.placement.placed == [("s1", 2, 2)]  # Redis had it first
    assert s.store.stored["s1"][-1].summary.kind == "append"  # persistence `always`: its version too
    assert lease.released and s.leases.holding == {} and not s.placement.pinned()
    assert s.recovery.acked.behind(meta("s1", version=1)).version == 2  # acknowledged


async def test_with_persistence_evict_a_commit_writes_metadata_alone_and_drops_the_stale_stored_version():
    s = Stepping(mode=Mode.EVICT)
    s.store.put(meta("s1", version=1), VersionWrite(None, summary(1), 3, 0))  # saved at an eviction
    assert (await s.append()).version == 2
    assert "s1" not in s.store.stored and s.blocks.writes == []


@pytest.mark.parametrize(
    ("failure", "error", "code"),
    [
        (Fenced(), Conflict, "lease_lost"),  # its lease expired, or another writer took it
        (SessionGone(), Gone, None),  # declared lost meanwhile
        (None, NotFound, None),  # the session moved on (deleted and made again, another replica's commit)
    ],
)
async def test_a_commit_redis_refuses_leaves_the_session_as_it_was(failure, error, code):
    s = Stepping()
    if failure is not None:
        s.store.fail("commit", failure)
    if isinstance(failure, SessionGone):
        s.store.put(meta("s1", version=1, tier="gone", gone=Lost.UNSAVED))
    async with s.steps.hold("alice", "s1") as (session, st, lease):
        if failure is None:
            s.store.put(meta("s1", version=5))
        with pytest.raises(error) as refused:
            await s.steps.commit(session, st, 12, lease=lease, kind="append")
    assert refused.value.code == code and s.placement.placed == []
    if error is Gone:  # and says why, as Redis recorded it
        assert "grace period" in refused.value.message
    assert s.store.sessions["s1"].version in (1, 5) and s.recovery.acked.behind(meta("s1", version=1)) is None


@pytest.mark.parametrize("applied", [True, False])
async def test_a_commit_whose_reply_was_lost_is_settled_before_anything_is_placed(applied):
    s = Stepping()
    s.store.fail("commit", OutcomeUnknown("Redis did not answer"))
    s.store.settled = applied
    if applied:
        assert (await s.append()).version == 2
        assert s.placement.placed == [
            ("s1", 2, 1)
        ]  # Redis said it holds the step (this fake did not apply it)
    else:
        with pytest.raises(Unavailable, match="found not applied"):
            await s.append()
        assert s.placement.placed == []
    assert s.observer.counts["outcome_unknown"] == 1


async def test_a_commit_once_begun_runs_to_its_end_though_its_request_is_cancelled():
    s = Stepping()
    gate = asyncio.Event()
    s.store.fail("commit", gate.wait)
    step = asyncio.ensure_future(s.append())
    while not s.store.calls["commit"]:
        await asyncio.sleep(0.01)
    step.cancel()  # the client left while Redis was committing
    await asyncio.sleep(0.05)
    gate.set()
    assert (await step).version == 2 and s.placement.placed == [("s1", 2, 2)]


async def test_a_step_cancelled_before_its_commit_began_commits_nothing():
    s = Stepping()
    gate = asyncio.Event()
    s.blocks.fail("write_encoded", gate.wait)  # still writing its new blocks
    step = asyncio.ensure_future(s.append())
    while not s.blocks.calls["write_encoded"]:
        await asyncio.sleep(0.01)
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    assert s.store.sessions["s1"].version == 1 and s.store.calls["commit"] == 0 and s.leases.holding == {}


async def test_a_new_session_is_written_with_its_version_then_placed_and_pinned_if_asked():
    s = Stepping()
    new = meta("s2", version=1)
    await s.steps.create(
        new, state(s.worker.pool, 8), summary=summary(1, kind="create"), stored=True, pin=True
    )
    assert s.store.sessions["s2"] == new and s.store.stored["s2"][0].summary.kind == "create"
    assert s.placement.placed == [("s2", 1, 1)] and s.placement.pinned()
    private = meta("s3", version=1)  # a turn's own session: its next commit writes the version
    await s.steps.create(private, state(s.worker.pool, 8), summary=summary(1), stored=False)
    s.placement.cache.unpin("s2")
    assert "s3" not in s.store.stored and not s.placement.pinned()


async def test_a_new_session_over_its_owners_limit_is_refused_once_the_index_is_pruned():
    s = Stepping(limit=1)
    with pytest.raises(InvalidRequest) as refused:
        await s.steps.create(meta("s2"), state(s.worker.pool, 8), summary=summary(1), stored=True)
    assert refused.value.code == "session_limit" and s.store.calls["list"] == 1  # pruned, then asked again
    assert "s2" not in s.store.sessions and s.placement.placed == []


async def test_a_step_on_an_unknown_or_foreign_session_is_404_and_on_a_busy_one_409():
    s = Stepping()
    for owner, session_id in (("alice", "nobody"), ("mallory", "s1")):
        with pytest.raises(NotFound):
            async with s.steps.hold(owner, session_id):
                pass
    async with s.steps.hold("alice", "s1"):
        with pytest.raises(Conflict):  # TXL_LEASE_WAIT_SECONDS=0: at once
            await s.append()
    assert s.observer.counts["conflict"] == 1


@pytest.mark.parametrize("renewal", ["taken", "unreachable"])
async def test_a_lease_lost_mid_step_ends_the_step_at_once_and_commits_nothing(renewal):
    s = Stepping(ttl=0.3)  # renewed every 0.1 s
    if renewal == "taken":
        s.leases.renewals = [True, False]
    else:  # Redis away until the lease would have expired
        s.leases.fail("renew", *[Unavailable("Redis does not answer")] * 10)
    s.worker.gate.clear()  # the job runs long
    with pytest.raises(Conflict) as lost:
        await asyncio.wait_for(s.append(), 5)
    assert lost.value.code == "lease_lost" and s.observer.counts["lease_lost"] == 1
    assert s.store.sessions["s1"].version == 1 and s.store.calls["commit"] == 0


async def test_a_step_keeps_its_lease_through_a_short_outage_of_redis():
    s = Stepping(ttl=0.6)
    s.leases.fail("renew", Unavailable("Redis does not answer"))  # once: the lease holds still
    s.worker.gate.clear()
    step = asyncio.ensure_future(s.append())
    while s.leases.calls["renew"] < 3:
        await asyncio.sleep(0.02)
    s.worker.gate.set()
    assert (await step).version == 2 and s.observer.counts["lease_lost"] == 0


async def test_a_step_keeps_its_lease_while_its_session_is_read_back():
    """Reading a session back may take long (a version written ahead of its blocks feeds its tokens again): the
    lease is renewed meanwhile, as while the step's own job runs."""
    s = Stepping(ttl=0.3)  # renewed every 0.1 s
    fetch = s.placement.fetch
    renewed_while_reading = []

    async def slow_fetch(session):
        await asyncio.sleep(0.5)
        renewed_while_reading.append(s.leases.calls["renew"])
        return await fetch(session)

    s.placement.fetch = slow_fetch
    assert (await s.append()).version == 2
    assert renewed_while_reading[0] >= 3 and s.observer.counts["lease_lost"] == 0


async def test_a_deletion_runs_under_the_lease_and_forgets_the_acknowledged_version():
    s = Stepping()
    await s.append()
    await s.steps.delete(s.store.sessions["s1"])
    assert "s1" not in s.store.sessions and s.recovery.acked.lost("s1") is None and s.leases.holding == {}


async def test_a_step_reports_its_progress_from_zero():
    s = Stepping()
    seen: list[tuple[int, int]] = []
    async with s.steps.hold("alice", "s1") as (_, st, lease):
        await s.steps.run(
            AdvanceJob(st, [1, 2, 3], report_progress=True), lease, progress=lambda *p: seen.append(p)
        )
    assert seen == [(0, 3), (3, 3)]
