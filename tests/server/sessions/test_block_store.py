"""The block store's parts, each against the same contract: a directory, an object store through obstore's own
local and in-memory backends, and the local tier in front of a shared store; blocks checked on read (a write cut
short or damaged is never read as a memory), and each session store's blocks in a namespace of its own."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from txl_server.errors import Unavailable
from txl_server.sessions.blocks.backend import Backend
from txl_server.sessions.blocks.codec import HEADER_BYTES, DamagedBlock, decode, encode
from txl_server.sessions.blocks.directory import DirectoryBackend
from txl_server.sessions.blocks.local_tier import LocalTier
from txl_server.sessions.blocks.objects import ObjectBackend, is_object_store_url
from txl_server.sessions.blocks.store import BlocksLost, BlockStore, Marker, block_key


def test_a_block_cut_short_or_damaged_is_refused_on_read():
    data = os.urandom(1000)
    raw = encode(data)
    assert decode(raw) == data and len(raw) == HEADER_BYTES + 1000
    for broken in (raw[:500], raw[: HEADER_BYTES - 1], raw[:-1] + bytes([raw[-1] ^ 1]), b"XXXX" + raw[4:]):
        with pytest.raises(DamagedBlock):
            decode(broken)


@pytest.fixture(params=["directory", "obstore-file", "obstore-memory", "local-tier"])
def backend(request, tmp_path) -> Backend:
    if request.param == "directory":
        return DirectoryBackend(tmp_path / "store")
    if request.param == "obstore-file":
        (tmp_path / "objects").mkdir()
        return ObjectBackend(f"file://{tmp_path / 'objects'}")
    if request.param == "obstore-memory":
        return ObjectBackend("memory://")
    return LocalTier(DirectoryBackend(tmp_path / "shared"), tmp_path / "local", budget=10_000)


async def test_every_backend_keeps_gets_lists_and_deletes_whole_objects(backend):
    await backend.put("blocks/ab/abc", b"one")
    await backend.put("blocks/ab/abc", b"two")  # replaced whole
    assert await backend.get("blocks/ab/abc") == b"two"
    assert await backend.get("blocks/ab/missing") is None
    assert await backend.put_new("mark", b"first") and not await backend.put_new("mark", b"second")
    assert await backend.get("mark") == b"first"
    listed = [item async for item in backend.listing("blocks/")]
    assert [item.key for item in listed] == ["blocks/ab/abc"] and listed[0].size == 3
    assert abs(listed[0].modified - time.time()) < 60
    await backend.delete(["blocks/ab/abc", "blocks/ab/never-was"])
    assert await backend.get("blocks/ab/abc") is None
    assert [item async for item in backend.listing("blocks/")] == []


async def test_the_store_reads_blocks_back_and_names_those_missing_or_damaged(tmp_path):
    store = BlockStore(DirectoryBackend(tmp_path))
    store.bind("s1")
    await store.write({"aa01": b"first", "bb02": b"second", "cc03": b"third"})
    assert await store.read(["bb02", "aa01"]) == [b"second", b"first"]
    os.unlink(tmp_path / "s1" / block_key("aa01"))
    path = tmp_path / "s1" / block_key("cc03")
    path.write_bytes(path.read_bytes()[:-2])  # a write cut short
    with pytest.raises(BlocksLost) as lost:
        await store.read(["aa01", "bb02", "cc03"])
    assert lost.value.missing == {"aa01"} and lost.value.damaged == {"cc03"}


async def test_each_session_store_has_its_own_namespace_and_mark(tmp_path):
    shared = DirectoryBackend(tmp_path)
    first, second = BlockStore(shared), BlockStore(shared)
    with pytest.raises(Unavailable):  # before Redis said which store it is
        await first.write({"x": b"y"})
    first.bind("one")
    second.bind("two")
    await first.write({"aa": b"of one"})
    assert [b async for b, _ in second.blocks()] == []
    assert await first.write_marker(Marker("one"), new=True)
    assert not await first.write_marker(Marker("one", loss_at=1.0), new=True)
    await second.write_marker(Marker("two", loss_at=5.0))
    assert await first.marker() == Marker("one") and await second.marker() == Marker("two", 5.0)
    assert await first.other_stores() == ["two"]


async def test_the_local_tier_keeps_recent_blocks_under_its_budget_and_rereads_a_damaged_copy(tmp_path):
    shared = DirectoryBackend(tmp_path / "shared")
    tier = LocalTier(shared, tmp_path / "local", budget=3 * (HEADER_BYTES + 100))
    store = BlockStore(tier)
    store.bind("s")
    blocks = {f"b{i}": bytes([i]) * 100 for i in range(5)}
    for block, data in blocks.items():  # one after another: the order of use is the order written
        await store.write({block: data})
    local = tmp_path / "local" / "s" / "blocks"

    def kept() -> list[str]:
        return sorted(p.name for p in local.rglob("b*") if p.is_file())

    assert kept() == ["b2", "b3", "b4"]  # the least recently used went
    assert tier.held_bytes == 3 * (HEADER_BYTES + 100)
    assert await store.read(["b0"]) == [blocks["b0"]]  # from the shared store, and kept
    assert kept() == ["b0", "b3", "b4"]
    (local / block_key("b4").removeprefix("blocks/")).write_bytes(
        b"garbage"
    )  # damaged: read it again, shared
    assert await store.read(["b4"]) == [blocks["b4"]]
    await store.delete(["b0"])
    assert await shared.get("s/" + block_key("b0")) is None and "b0" not in kept()


async def test_a_second_replica_reads_what_the_first_wrote_through_the_shared_store(tmp_path):
    shared = ObjectBackend(f"file://{tmp_path}")
    one = BlockStore(LocalTier(shared, tmp_path.parent / f"{tmp_path.name}-one", budget=10**6))
    two = BlockStore(LocalTier(shared, tmp_path.parent / f"{tmp_path.name}-two", budget=10**6))
    one.bind("s")
    two.bind("s")
    await one.write({"cafe": b"written by one"})
    assert await two.read(["cafe"]) == [b"written by one"]


def test_object_store_urls_are_told_from_directories():
    assert (
        is_object_store_url("s3://bucket/prefix")
        and is_object_store_url("gs://b")
        and is_object_store_url("az://c")
    )
    assert not is_object_store_url("/data/blocks") and not is_object_store_url("relative/dir")


async def test_a_directory_write_leaves_no_temporary_file_behind(tmp_path: Path):
    backend = DirectoryBackend(tmp_path, fsync=True)
    await backend.put("blocks/x/y", b"z")
    assert [p.name for p in (tmp_path / "blocks" / "x").iterdir()] == ["y"]
