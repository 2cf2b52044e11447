"""Session history on its own (sessions/history.py), over fakes: which versions a session keeps and where each is
read from (the device first, then Redis), and a rewind committed as a new version."""

from __future__ import annotations

import contextlib

import pytest
import torch
from txl_server.errors import NotFound
from txl_server.sessions.history import SessionHistory
from txl_server.sessions.state_cache import StateCache
from txl_server.sessions.store.lease import Lease
from txl_server.settings import Persistence as Mode
from txl_server.settings import Settings

from tests.helpers import session_fakes as fakes
from tests.helpers.session_fakes import (
    FakeSessionStore,
    FakeWorker,
    meta,
    state,
    summary,
)
from tests.helpers.states import same_state


class Sessions:
    """What history asks of the rest: the session (recovery), its state on the device (placement), a step."""

    def __init__(self, store: FakeSessionStore, worker: FakeWorker) -> None:
        self.store, self.worker = store, worker
        self.cache = StateCache(device_budget=1 << 20, host_budget=0)
        self.committed: list[tuple[int, int, str, str | None, object]] = []

    async def get(self, owner, session_id):
        return self.store.sessions[session_id]

    async def fetch(self, session):
        return self.cache.peek(session.id).state

    @contextlib.asynccontextmanager
    async def hold(self, owner, session_id):
        session = self.store.sessions[session_id]
        yield session, self.cache.peek(session_id).state, Lease(session_id, "t", 10)

    async def commit(self, session, st, tokens, *, lease, kind, text=None, receipt=None):
        self.committed.append((session.version + 1, tokens, kind, text, st))
        return meta(session.id, version=session.version + 1, tokens=tokens)


class Kept(fakes.Stored):
    def __init__(self, mode: Mode = Mode.ALWAYS) -> None:
        super().__init__(Settings(persistence=mode, keep_versions=3))
        self.sessions = Sessions(self.store, self.worker)
        self.history = SessionHistory(
            recovery=self.sessions,
            steps=self.sessions,
            placement=self.sessions,
            persistence=self.persistence,
            store=self.store,
        )
        self.states = {v: state(self.worker.pool, 4 * v, fill=float(v)) for v in (1, 2, 3)}

    async def stored(self, *versions: int) -> None:
        """Redis holds these versions of s1 (its metadata at the last)."""
        writes = []
        for v in versions:
            writes.append((await self.persistence.prepare(self.states[v], summary(v, tokens=10 * v))).version)
        self.store.put(meta("s1", version=versions[-1], tokens=10 * versions[-1]), *writes)

    def on_device(self, newest: int, *older: int) -> None:
        """This process holds s1 at `newest`, and these older versions beside it."""
        self.sessions.cache.put(
            "s1",
            self.states[newest],
            newest,
            older={v: self.states[v] for v in older},
            summaries=[summary(v, tokens=10 * v) for v in (*older, newest)],
        )


async def test_the_versions_list_comes_from_redis_then_from_this_process_else_the_newest_alone():
    k = Kept()
    await k.stored(1, 2, 3)
    assert [s.version for s in await k.history.versions("alice", "s1")] == [3, 2, 1]
    k.store.put(meta("s1", version=4))  # committed here, not yet stored
    k.states[4] = state(k.worker.pool, 4)
    k.on_device(4, 3)
    assert [s.version for s in await k.history.versions("alice", "s1")] == [4, 3]
    k.sessions.cache.drop("s1")
    assert [s.kind for s in await k.history.versions("alice", "s1")] == ["append"]  # what the metadata says


async def test_an_older_version_is_read_from_the_device_before_redis():
    k = Kept()
    await k.stored(1, 2, 3)
    k.on_device(3, 2)
    two, about = await k.history.state_at(k.store.sessions["s1"], 2)
    assert same_state(two, k.states[2]) and about.tokens == 20 and k.store.calls["load_version"] == 0
    one, _ = await k.history.state_at(k.store.sessions["s1"], 1)  # only Redis keeps it
    assert k.store.calls["load_version"] == 1 and one.memory.pool is k.worker.pool
    assert torch.equal(one.memory.keys(0), k.states[1].memory.keys(0))
    newest, _ = await k.history.state_at(k.store.sessions["s1"], 3)
    assert same_state(newest, k.states[3])


@pytest.mark.parametrize("mode", [Mode.ALWAYS, Mode.EVICT])
async def test_a_version_not_kept_is_404_naming_the_oldest_kept(mode):
    k = Kept(mode)
    if mode is Mode.ALWAYS:
        await k.stored(2, 3)
    else:  # versions live in this process only
        k.store.put(meta("s1", version=3))
        k.on_device(3, 2)
    with pytest.raises(NotFound, match="the oldest kept version is 2") as missing:
        await k.history.state_at(k.store.sessions["s1"], 1)
    assert missing.value.code == "version_not_found"


async def test_a_rewind_commits_a_new_version_holding_the_old_ones_memory():
    k = Kept()
    await k.stored(1, 2, 3)
    k.on_device(3, 2)
    rewound = await k.history.rewind("alice", "s1", 2)
    assert rewound.version == 4
    ((*committed, state),) = k.sessions.committed
    assert committed == [4, 20, "rewind", "text of 2"] and same_state(state, k.states[2])
