"""Recovery on its own (sessions/recovery.py), over a fake session store, fake heartbeats and leases
(tests/helpers/session_fakes.py): which sessions can be continued, what a lost one answers and why, and what a
store that came back older or empty answers."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from txl_server.errors import Gone, NotFound, Unavailable
from txl_server.sessions.recovery import Lost, Reconciled, Recovery, Replica
from txl_server.sessions.store.versions import VersionWrite

from tests.helpers.session_fakes import FakeHeartbeats, FakeLeases, FakeSessionStore, Recorder, meta, summary

ME = Replica("me", "1")
ALIVE, DEAD = "other#1", "other#2"


def stored(version: int) -> VersionWrite:
    return VersionWrite(None, summary(version), 3, 0)  # what Redis holds is all that matters here


class Known:
    def __init__(self, *, exclusive: bool = False) -> None:
        self.store = FakeSessionStore()
        self.leases = FakeLeases(self.store)
        self.observer = Recorder()
        stores = SimpleNamespace(sessions=self.store, leases=self.leases, heartbeats=FakeHeartbeats(ALIVE))
        self.recovery = Recovery(stores, me=ME, exclusive=exclusive, observer=self.observer)

    def sessions(self) -> list:
        s = self.store
        return [
            s.put(meta("stored", version=2, holder=DEAD), stored(2)),  # Redis holds its version
            s.put(meta("alive", version=2, holder=ALIVE)),  # its holder keeps it
            s.put(meta("mine", version=2, holder=ME.id)),  # this process committed it
            s.put(meta("dead", version=2, holder=DEAD)),
            s.put(meta("behind", version=2, holder=DEAD), stored(1)),  # Redis holds an older one only
            s.put(meta("earlier", tier="gone", gone=Lost.EVICTED)),
        ]

    def gone(self) -> dict[str, str]:
        return {s.id: s.gone for s in self.store.sessions.values() if s.tier == "gone"}


async def test_a_session_can_be_continued_if_redis_holds_its_version_or_its_holder_is_alive():
    k = Known()
    kept = await k.recovery.settle(k.sessions())
    assert [s.id for s in kept] == ["stored", "alive", "mine"]
    assert k.gone() == {"dead": Lost.CRASHED, "behind": Lost.CRASHED, "earlier": Lost.EVICTED}


async def test_with_a_private_redis_every_other_holder_is_dead():
    k = Known(exclusive=True)
    kept = await k.recovery.settle(k.sessions())
    assert [s.id for s in kept] == ["stored", "mine"] and k.gone()["alive"] == Lost.CRASHED


async def test_a_lost_session_answers_410_saying_why_and_anothers_404():
    k = Known()
    k.sessions()
    with pytest.raises(Gone, match="dropped to make room"):
        await k.recovery.get("alice", "earlier")
    with pytest.raises(Gone, match="stopped without saving"):  # found lost now, on the way
        await k.recovery.get("alice", "dead")
    assert (await k.recovery.get("alice", "stored")).id == "stored"
    with pytest.raises(NotFound):
        await k.recovery.get("mallory", "stored")


async def test_a_session_redis_holds_older_than_acknowledged_is_410_and_never_continued():
    k = Known()
    k.recovery.acked.note(meta("s1", version=5, holder=ME.id))
    k.store.put(meta("s1", version=3, holder=ME.id))  # Redis came back from an older snapshot
    with pytest.raises(Gone) as lost:
        await k.recovery.get("alice", "s1")
    assert lost.value.code == "store_lost_steps" and k.gone() == {"s1": Lost.STEPS_LOST}
    assert k.observer.counts["loss:steps"] == 1 and await k.recovery.list_continuable("alice") == []


async def test_a_session_redis_lost_whole_is_410_unless_it_was_deleted_or_is_anothers():
    k = Known()
    k.recovery.acked.note(meta("s1", last_used=time.time(), holder=ME.id))
    k.recovery.acked.note(meta("s2", last_used=time.time(), holder=ME.id))
    assert isinstance(await k.recovery.not_found("mallory", "s1"), NotFound)
    lost = await k.recovery.not_found("alice", "s1")  # Redis restarted empty
    assert (
        isinstance(lost, Gone) and lost.code == "store_lost_session" and k.gone() == {"s1": Lost.SESSION_LOST}
    )
    k.store.deleted.add("s2")  # deleted by its owner meanwhile
    assert isinstance(await k.recovery.not_found("alice", "s2"), NotFound)
    assert isinstance(await k.recovery.not_found("alice", "never-known"), NotFound)
    assert k.observer.counts["loss:session"] == 1


async def test_a_state_found_nowhere_is_held_elsewhere_or_lost_with_its_holder():
    k = Known()
    k.sessions()
    assert isinstance(await k.recovery.missing(k.store.sessions["alive"]), Unavailable)
    assert isinstance(await k.recovery.missing(k.store.sessions["dead"]), Gone)
    assert k.gone()["dead"] == Lost.CRASHED
    mine = await k.recovery.missing(k.store.sessions["mine"])  # this process is placing it right now
    assert isinstance(mine, Gone) and "mine" not in k.gone()


async def test_start_up_reconciles_every_session_and_breaks_the_leases_of_dead_replicas():
    k = Known()
    k.sessions()
    k.leases.listed = [("s1", f"{DEAD}/a"), ("s2", f"{ALIVE}/b"), ("s3", "c")]  # "c": a server before holders
    found = await k.recovery.reconcile()
    assert found == Reconciled(kept=3, lost=2, gone=1, leases_broken=1)
    assert k.leases.broken == [("s1", f"{DEAD}/a")]
