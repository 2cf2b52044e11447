"""Admission on its own (sessions/admission.py), over fakes: the TTL's bounds, the owner's session limit (counted
exactly only when it matters), and room on the device: refused for good when a state could never fit, for now
when the states pinned by steps in flight leave no room."""

from __future__ import annotations

import pytest
from txl_server.errors import InvalidRequest, Overloaded
from txl_server.sessions.admission import Admission
from txl_server.sessions.state_cache import StateCache
from txl_server.settings import Settings

from tests.helpers import session_fakes as fakes
from tests.helpers.session_fakes import FakeModel, FakeWorker, state

# A session of mem_len 32 on the fake model (16 bytes a position, segments of 4) peaks at 64 positions, 1 KiB;
# one of mem_len 128 at 160 positions, 2.5 KiB.
BUDGET = 2048


class Index:
    """The owner's session index: `listed` as the index counts them (expired ones included), `live` exactly."""

    def __init__(self, listed: int, live: int) -> None:
        self.listed, self.live = listed, live
        self.exact_counts = 0

    async def count(self, owner: str) -> int:
        return self.listed

    async def count_exact(self, owner: str) -> int:
        self.exact_counts += 1
        return self.live


def admission(*, listed: int = 0, live: int = 0, limit: int = 3) -> Admission:
    worker = FakeWorker(fakes.pool())
    return Admission(
        settings=Settings(max_sessions_per_tenant=limit, default_ttl_seconds=600, max_ttl_seconds=3600),
        model=FakeModel(),
        worker=worker,
        cache=StateCache(device_budget=BUDGET, host_budget=0),
        store=Index(listed, live),
    )


def test_a_ttl_is_the_default_unless_given_and_within_the_servers_bounds():
    a = admission()
    assert a.ttl(None) == 600 and a.ttl(1) == 1 and a.ttl(3600) == 3600
    for ttl in (0, 3601):
        with pytest.raises(InvalidRequest) as refused:
            a.ttl(ttl)
        assert refused.value.param == "ttl_seconds"


async def test_the_owners_limit_counts_exactly_only_when_the_index_reaches_it():
    below = admission(listed=2, live=2)
    await below.session("alice", 32)
    assert below.store.exact_counts == 0  # one read of the index, nothing pruned
    expired = admission(listed=3, live=2)  # the index still lists an expired session
    await expired.session("alice", 32)
    assert expired.store.exact_counts == 1
    with pytest.raises(InvalidRequest, match=r"session limit reached \(3\)"):
        await admission(listed=3, live=3).session("alice", 32)


def test_a_state_that_could_never_fit_the_device_is_refused_for_good():
    a = admission()
    a.fits(32)
    with pytest.raises(Overloaded, match="mem_len 128 needs 2560 bytes") as refused:
        a.fits(128)
    assert refused.value.retry_after == 60


def test_a_state_that_does_not_fit_beside_the_steps_in_flight_is_refused_for_now():
    a = admission()
    a.cache.put("busy", state(a.worker.pool, 64), 1)  # 16 blocks of 64 bytes, and its hidden state
    a.fits(32)  # idle states move away to make room
    a.cache.pin("busy")  # a step holds it on the device
    with pytest.raises(Overloaded, match="retry shortly") as refused:
        a.fits(32)
    assert refused.value.retry_after == 1
    a.fits(8)  # a smaller one still fits beside it
    a.cache.unpin("busy")
    a.fits(32)
