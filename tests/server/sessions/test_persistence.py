"""Persistence on its own (sessions/persistence.py), over a fake session store and a fake block store
(tests/helpers/session_fakes.py) and real states in a real tiny pool: what a version sends, what it does when the
store lost blocks, the order "write durably, then place", reading back, saving at eviction, snapshots."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from txl_server.engine.state import ModelState
from txl_server.errors import Gone, InvalidRequest
from txl_server.sessions.state_cache import DEVICE, Entry
from txl_server.sessions.store.lease import Lease

from tests.helpers import session_fakes as fakes
from tests.helpers.session_fakes import (
    meta,
    state,
    summary,
)


class Stores(fakes.Stored):
    async def create(self, session_id: str, st: ModelState, version: int = 1) -> None:
        """Writes `st` as the session's stored version, durably, as a new session's create does."""
        session = meta(session_id, version=version)
        durable = await self.persistence.prepare(st, fakes.summary(version))

        async def write(stored):
            await self.store.create(session, stored, lease=Lease(session_id, "t", 10))

        async def place(_):
            pass

        await durable.write_then_place(write, place)


def same_values(a: ModelState, b: ModelState) -> bool:
    return (
        torch.equal(a.memory.keys(0), b.memory.keys(0))
        and torch.equal(a.memory.values(0), b.memory.values(0))
        and torch.equal(a.last_hidden, b.last_hidden)
        and a.tail == b.tail
    )


async def test_a_version_sends_only_the_blocks_the_store_does_not_hold_yet():
    s = Stores()
    first = state(s.worker.pool, 8)  # two blocks
    await s.create("s1", first)
    assert [len(ids) for ids in s.blocks.writes] == [2]
    again = await s.persistence.prepare(first, summary(2))  # its blocks are stored already: none sent
    shorter = ModelState(
        first.memory.with_mem_len(4), first.last_hidden, first.tail
    )  # its last block, shared
    slid = await s.persistence.prepare(shorter, summary(3))
    assert again.version.stored.new_blocks == {} and slid.version.stored.new_blocks == {}
    assert again.version.stored.block_ids == s.store.stored["s1"][0].stored.block_ids
    assert slid.version.stored.block_ids == again.version.stored.block_ids[1:]
    whole = await s.persistence.prepare(first, summary(4), full=True)
    assert len(whole.version.stored.new_blocks) == 2 and len(s.blocks.writes) == 2


async def test_a_version_naming_blocks_the_store_lost_is_written_again_whole():
    s = Stores()
    st = state(s.worker.pool, 8)
    await s.create("s1", st)
    s.blocks.blocks.clear()  # they expired in the store
    s.store.put(meta("s2"))
    durable = await s.persistence.prepare(st, summary(1))
    assert durable.version.stored.new_blocks == {}  # the index still thinks the store holds them
    outcomes = []

    async def place(outcome):
        outcomes.append(outcome)

    saved = await durable.write_then_place(lambda w: s.store.save_version("s2", 1, w, 60), place)
    assert saved is True and outcomes == [True] and s.store.calls["save_version"] == 2
    assert set(s.store.stored["s2"][0].stored.block_ids) == set(s.blocks.blocks)  # every block sent again


async def test_a_state_is_placed_only_once_its_write_succeeded():
    s = Stores()
    order: list[str] = []

    async def write(stored):
        order.append("write")
        return stored

    async def place(stored):
        order.append("place")

    unstored = s.persistence.unstored(state(s.worker.pool, 8))
    assert await unstored.write_then_place(write, place) is None  # the metadata alone: nothing stored
    assert order == ["write", "place"] and s.blocks.writes == []

    async def refused(stored):
        raise RuntimeError("Redis refused it")

    durable = await s.persistence.prepare(state(s.worker.pool, 8), summary(1))
    with pytest.raises(RuntimeError):
        await durable.write_then_place(refused, place)
    assert order == ["write", "place"]  # nothing placed


async def test_a_stored_version_reads_back_into_the_devices_pool_on_the_worker():
    s = Stores()
    st = state(s.worker.pool, 7, fill=3.0)
    await s.create("s1", st)
    back = await s.persistence.read(meta("s1", version=1))
    assert back is not None and s.worker.calls == 1 and back.memory.pool is s.worker.pool
    assert same_values(back, st) and back.memory.block_ids().tolist() != st.memory.block_ids().tolist()
    assert await s.persistence.read(meta("s1", version=2)) is None  # Redis holds another version


async def test_a_stored_version_whose_blocks_are_gone_answers_410():
    s = Stores()
    await s.create("s1", state(s.worker.pool, 8))
    s.blocks.blocks.clear()
    with pytest.raises(Gone, match="expired"):  # Redis says a block it lists expired
        await s.persistence.read(meta("s1"))
    s.store.block_store = None  # Redis still lists them; the block store lost them (deleted by hand)
    with pytest.raises(Gone) as lost:
        await s.persistence.read(meta("s1"))
    assert lost.value.code == "store_blocks_missing"


async def test_a_session_leaving_this_process_is_saved_at_its_version_then_leaves():
    s = Stores()
    st = state(s.worker.pool, 8)
    s.store.put(meta("s1", version=2))
    order: list[str] = []

    async def leave():
        order.append(f"left with {len(s.store.stored.get('s1', []))} stored")

    await s.persistence.save("s1", Entry(st, 2, DEVICE, summaries=[summary(2)]), then=leave)
    assert order == ["left with 1 stored"] and s.store.stored["s1"][0].summary == summary(2)
    s.store.put(meta("s2", version=3))  # moved on (another replica committed): nothing of this one to keep
    s.store.put(meta("s3", version=2, tier="gone"))
    for session_id in ("s2", "s3", "never-known"):
        await s.persistence.save(session_id, Entry(st, 2, DEVICE), then=leave)
    assert len(order) == 4 and "s2" not in s.store.stored and "s3" not in s.store.stored


async def test_a_snapshot_reads_back_and_one_that_does_not_fit_is_refused():
    s = Stores()
    st = state(s.worker.pool, 6, fill=2.0)
    session = meta("s1", tokens=40, metadata={"user": "ann"})
    imported = await s.persistence.imported(await s.persistence.export(session, st))
    assert same_values(imported.state, st) and imported.tokens == 40 and imported.metadata == {"user": "ann"}
    with pytest.raises(InvalidRequest, match="not a session snapshot"):
        await s.persistence.imported(b"\x00" * 64)
    wide = state(s.worker.pool, 6, mem_len=128)  # more memory than this server allows
    with pytest.raises(InvalidRequest, match="mem_len"):
        await s.persistence.imported(await s.persistence.export(session, wide))
    foreign = dataclasses.replace(st, tail=(999,))  # a token this model's vocabulary does not have
    with pytest.raises(InvalidRequest, match="vocabulary"):
        await s.persistence.imported(await s.persistence.export(session, foreign))


async def test_blocks_written_ahead_of_a_commit_are_not_written_again_and_read_back_alike():
    """A generation's fed prompt is written while it decodes (Persistence.prewrite): its commit sends only what
    the decoding added, the version names the blocks written ahead, and it reads back as the state it commits."""
    s = Stores()
    prompt = state(s.worker.pool, 8)  # two full blocks
    early = await s.persistence.prewrite(prompt).result()
    assert early is not None and len(early.blocks) == 2 and s.blocks.writes == [list(early.blocks.values())]
    decoded = ModelState(prompt.memory, torch.full_like(prompt.last_hidden, 2.0), (4, 5))
    durable = await s.persistence.prepare(decoded, summary(1), early=early)
    stored = durable.version.stored
    assert stored.new_blocks == {} and len(s.blocks.writes) == 1  # nothing sent twice
    assert set(stored.block_ids) == set(early.blocks.values())
    assert durable.version.written_at <= early.written_at  # the freshness check dates them from the prewrite

    async def write(version):
        await s.store.create(meta("s1"), version, lease=Lease("s1", "t", 10))

    async def place(_):
        pass

    await durable.write_then_place(write, place)
    read = await s.persistence.read(meta("s1", version=1))
    assert read is not None and same_values(read, decoded)


async def test_a_prewrite_that_failed_leaves_its_blocks_to_the_commit():
    s = Stores()
    prompt = state(s.worker.pool, 8)
    s.blocks.fail("write_encoded", OSError("the block store is away"))
    assert await s.persistence.prewrite(prompt).result() is None
    durable = await s.persistence.prepare(prompt, summary(1), early=None)
    assert len(durable.version.stored.new_blocks) == 2 and len(s.blocks.writes) == 1
