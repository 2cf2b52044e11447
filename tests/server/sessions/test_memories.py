"""Preloaded memories on their own (sessions/memories.py), over fakes: a memory is written durably then placed,
refused before any work when it cannot be kept, read from Redis once per replica however many ask at once, pinned
while used, and deleted without touching what shares its blocks."""

from __future__ import annotations

import asyncio
import time

import pytest
from txl_server.errors import Gone, InvalidRequest, NotFound
from txl_server.sessions.admission import Admission
from txl_server.sessions.memories import MemoryService
from txl_server.sessions.prefix_cache import Read
from txl_server.sessions.state_cache import DEVICE, StateCache
from txl_server.sessions.store.versions import BlocksMissing, LoadedVersion
from txl_server.settings import Settings

from tests.helpers import session_fakes as fakes
from tests.helpers.session_fakes import (
    FakeBlockStore,
    FakeModel,
    FakeWorker,
    Recorder,
    state,
)
from tests.helpers.states import same_state


class Bytes:
    def encode(self, text: str) -> list[int]:
        return list(text.encode())


class FakeMemoryStore(fakes.Scripted):
    """The memory store (store/memories.py): metadata and each memory's one stored version."""

    def __init__(self, blocks: FakeBlockStore) -> None:
        super().__init__()
        self.blocks = blocks
        self.memories: dict = {}
        self.versions: dict = {}

    async def create(self, memory, write) -> None:
        await self._cue("create")
        self.memories[memory.id], self.versions[memory.id] = memory, write

    async def get(self, memory_id):
        await self._cue("get")
        return self.memories.get(memory_id)

    async def update(self, memory) -> bool:
        self.memories[memory.id] = memory
        return True

    async def delete(self, owner, memory_id) -> bool:
        return self.memories.pop(memory_id, None) is not None

    async def list(self, owner):
        return [m for m in self.memories.values() if m.owner == owner]

    async def count(self, owner) -> int:
        return len(await self.list(owner))

    async def load(self, memory_id):
        await self._cue("load")
        write = self.versions.get(memory_id)
        if write is None:
            return None
        if any(b not in self.blocks.blocks for b in write.stored.block_ids):
            raise BlocksMissing(set(write.stored.block_ids))
        header = write.stored.header
        return LoadedVersion(1, header, write.stored.hidden, [b""] * len(header["blocks"]), None, {})


class Reading:
    """The prompt reader: a prompt's state is one position per token and the start token, the same state for the
    same tokens (as states share blocks wherever they were read from); `gate`: held."""

    def __init__(self, worker: FakeWorker) -> None:
        self.worker = worker
        self.gate = asyncio.Event()
        self.gate.set()
        self.states: dict = {}

    async def read(self, owner, tokens, *, mem_len, progress=None, through_cache=True, **_):
        await self.gate.wait()
        st = self.states.setdefault(tuple(tokens), state(self.worker.pool, len(tokens) + 1))
        return Read(st, 0)


class Placing:
    """Placement as memories use it; `placed` records whether Redis held the memory when it was placed."""

    def __init__(self, store: FakeMemoryStore) -> None:
        self.store = store
        self.cache = StateCache(device_budget=1 << 20, host_budget=0)
        self.placed: list[tuple[str, bool]] = []
        self.expiry: dict[str, float] = {}

    async def place_memory(self, memory_id, st, expires_at) -> None:
        self.placed.append((memory_id, memory_id in self.store.memories))
        self.cache.put(memory_id, st, 1, DEVICE)
        self.expiry[memory_id] = expires_at

    def forget(self, memory_id) -> None:
        self.cache.drop(memory_id)

    def extend(self, memory_id, expires_at) -> None:
        self.expiry[memory_id] = expires_at


class Memories(fakes.Stored):
    def __init__(self, *, limit: int = 100) -> None:
        settings = Settings(max_memories_per_tenant=limit, default_ttl_seconds=600)
        super().__init__(settings)
        self.store = FakeMemoryStore(self.blocks)
        self.prompts = Reading(self.worker)
        self.placement = Placing(self.store)
        self.observer = Recorder()
        sessions = self.persistence.store
        self.service = MemoryService(
            settings=settings,
            tokenizer=Bytes(),
            worker=self.worker,
            store=self.store,
            prompts=self.prompts,
            admission=Admission(
                settings=settings,
                model=FakeModel(),
                worker=self.worker,
                cache=self.placement.cache,
                store=sessions,
            ),
            placement=self.placement,
            persistence=self.persistence,
            observer=self.observer,
            model_id="tiny",
            mem_len=32,
        )

    def pinned(self) -> bool:
        return self.placement.cache.pinned_bytes() > 0


async def test_a_memory_is_written_with_every_block_then_placed():
    m = Memories()
    memory = await m.service.create("alice", "a document", name="doc", metadata={"k": "v"})
    assert (memory.tokens, memory.mem_tokens, memory.mem_len, memory.name) == (10, 11, 32, "doc")
    assert m.store.memories[memory.id] == memory and m.placement.placed == [(memory.id, True)]
    assert len(m.blocks.writes) == 1 and len(m.blocks.writes[0]) == 3  # 11 positions: every block, sent
    assert memory.expires_at == pytest.approx(time.time() + 600, abs=5)
    assert m.observer.counts["ingested"] == 11
    again = await m.service.create(
        "alice", "a document"
    )  # its blocks are stored already: sent again all the same
    assert [len(w) for w in m.blocks.writes] == [3, 3] and again.id != memory.id


@pytest.mark.parametrize(
    ("text", "name", "error"),
    [
        ("", None, "empty"),
        ("text", "n" * 129, "longer than 128"),
        ("text", None, r"memory limit reached \(1\)"),
    ],
)
async def test_a_memory_that_cannot_be_kept_is_refused_before_any_work(text, name, error):
    m = Memories(limit=1)
    if "limit" in error:
        await m.service.create("alice", "the first")
        m.placement.placed.clear()
    m.prompts.gate.clear()  # reading would wait: a refusal must not
    with pytest.raises(InvalidRequest, match=error):
        await asyncio.wait_for(m.service.create("alice", text, name=name), 1)
    assert m.placement.placed == []


async def test_a_memory_cancelled_before_its_commit_leaves_nothing_behind():
    m = Memories()
    m.prompts.gate.clear()
    creating = asyncio.ensure_future(m.service.create("alice", "a document"))
    await asyncio.sleep(0.05)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    assert m.store.memories == {} and m.blocks.writes == [] and m.placement.placed == []


async def test_a_memory_is_pinned_while_any_request_uses_it():
    m = Memories()
    memory = await m.service.create("alice", "a document")
    async with m.service.using("alice", memory.id):
        async with m.service.using("alice", memory.id) as (_, st):
            assert m.pinned() and st.memory.length == 11
        assert m.pinned()  # the first user still holds it
    assert not m.pinned()


async def test_a_replica_reads_a_memory_from_redis_once_however_many_ask_at_once():
    m = Memories()
    memory = await m.service.create("alice", "a document")
    m.placement.forget(memory.id)  # another replica made it (or this one moved it off the device)
    m.placement.placed.clear()
    gate = asyncio.Event()
    m.store.fail("load", gate.wait)

    async def use():
        async with m.service.using("alice", memory.id) as (_, st):
            return st

    users = [asyncio.ensure_future(use()) for _ in range(4)]
    await asyncio.sleep(0.05)
    gate.set()
    states = await asyncio.gather(*users)
    assert m.store.calls["load"] == 1 and len({id(s) for s in states}) == 1
    assert m.placement.placed == [(memory.id, True)] and m.worker.calls == 1
    assert states[0].memory.length == 11


async def test_a_memory_whose_stored_state_is_gone_answers_410_and_an_unknown_one_404():
    m = Memories()
    memory = await m.service.create("alice", "a document")
    m.placement.forget(memory.id)
    m.blocks.blocks.clear()
    with pytest.raises(Gone, match="expired"):
        async with m.service.using("alice", memory.id):
            pass
    with pytest.raises(NotFound):
        await m.service.get("mallory", memory.id)
    calls = m.store.calls["get"]
    with pytest.raises(NotFound):
        await m.service.get("alice", "not/an/id")  # no key to look up
    assert m.store.calls["get"] == calls


async def test_a_memory_gone_from_redis_drops_this_processs_copy():
    m = Memories()
    memory = await m.service.create("alice", "a document")
    del m.store.memories[memory.id]  # expired in Redis
    with pytest.raises(NotFound):
        await m.service.get("alice", memory.id)
    assert memory.id not in m.placement.cache


async def test_an_update_sets_its_name_and_a_new_expiry_here_too():
    m = Memories()
    memory = await m.service.create("alice", "a document", ttl_seconds=60)
    updated = await m.service.update("alice", memory.id, ttl_seconds=3000, changes={"name": "renamed"})
    assert (
        updated.name == "renamed" and m.placement.expiry[memory.id] == updated.expires_at > memory.expires_at
    )
    with pytest.raises(InvalidRequest):
        await m.service.update("alice", memory.id, changes={"name": "n" * 129})


async def test_deleting_a_memory_takes_only_its_own_references_away():
    m = Memories()
    memory = await m.service.create("alice", "a document")
    async with m.service.using("alice", memory.id) as (_, st):
        await m.service.delete("alice", memory.id)
        assert memory.id not in m.store.memories and memory.id not in m.placement.cache
        assert st.memory.keys(0).shape[2] == 11  # a request using it keeps its state
    with pytest.raises(NotFound):
        await m.service.delete("alice", memory.id)


async def test_scoring_from_a_memory_feeds_the_text_after_its_state():
    m = Memories()
    memory = await m.service.create("alice", "a document")
    scored = await m.service.score("alice", memory.id, "next")
    assert (scored.tokens, scored.logprob) == (4, -4.0) and m.observer.counts["scored"] == 4
    job = m.worker.jobs[-1]
    assert same_state(job.state, m.placement.cache.peek(memory.id).state) and job.tokens == list(b"next")
