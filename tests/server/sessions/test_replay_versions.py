"""Versions written ahead of their blocks, in a real Redis (lua/versions.lua's write_replay, settle_version.lua):
what Redis refuses (then nothing is written), how a chain of them reads, and how settling one moves its blocks'
references."""

from __future__ import annotations

import pytest
from txl_server.sessions.store.plumbing import now
from txl_server.sessions.store.versions import Replay, ReplayRefused, VersionSummary

from .test_stored_memory import _commit_write, _create, _meta, _refs, _write
from .test_stored_memory import store as store  # a fixture


def _replay(version: int, tokens: list[int], fed: int, keep: int = 32, max_tokens: int = 64) -> Replay:
    summary = VersionSummary(version, fed, now(), "append", f"v{version}")
    return Replay(summary, tuple(tokens), fed, keep, max_tokens)


async def test_a_chain_of_versions_ahead_of_their_blocks_reads_as_the_last_settled_one_and_every_token(store):
    await _create(store, _meta("s"), _write(1, ["a", "b"], ["a", "b"]))  # fed 1
    assert await _commit_write(store, "s", 2, _replay(2, [7, 8], fed=3))
    assert await _commit_write(store, "s", 3, _replay(3, [9], fed=4))
    newest = await store.load_version("s")
    assert newest.version == 3 and newest.header["blocks"] == ["a", "b"] and newest.header["fed"] == 1
    assert newest.replay == (7, 8, 9) and newest.hidden is None
    assert (await store.load_version("s", 2)).replay == (7, 8)
    assert (await store.load_version("s", 1)).replay == ()
    assert [await _refs(store, b) for b in "ab"] == [3, 3]  # every version lists them
    assert [v.text_tail for v in await store.versions("s")] == ["v1", "v2", "v3"]


@pytest.mark.parametrize(
    "replay",
    [
        _replay(2, [7, 8], fed=4),  # the tokens do not bring the stored state to `fed`
        _replay(2, list(range(5)), fed=6, max_tokens=4),  # a reader would feed too many again
        _replay(2, [], fed=1),  # nothing to feed: a version with its blocks
    ],
    ids=["wrong-fed", "too-long", "empty"],
)
async def test_redis_refuses_a_version_ahead_of_its_blocks_it_could_not_read_back(store, replay):
    await _create(store, _meta("s"), _write(1, ["a"], ["a"]))
    with pytest.raises(ReplayRefused):
        await _commit_write(store, "s", 2, replay)
    assert (await store.get("s")).version == 1 and [v.version for v in await store.versions("s")] == [1]
    assert await _refs(store, "a") == 1


async def test_a_chain_too_long_to_read_back_is_refused(store):
    await _create(store, _meta("s"), _write(1, ["a"], ["a"]))
    assert await _commit_write(store, "s", 2, _replay(2, [1, 2, 3], fed=4, max_tokens=4))
    with pytest.raises(ReplayRefused):
        await _commit_write(store, "s", 3, _replay(3, [4, 5], fed=6, max_tokens=4))
    assert (await store.get("s")).version == 2


async def test_settling_a_version_moves_its_references_to_its_own_blocks(store):
    await _create(store, _meta("s"), _write(1, ["a", "b"], ["a", "b"]))
    assert await _commit_write(store, "s", 2, _replay(2, [7, 8], fed=3, keep=1))  # the first version goes
    assert [await _refs(store, b) for b in "ab"] == [1, 1]
    own = _write(2, ["a", "c"], ["c"])  # its state: block a as it was, c new
    assert await store.settle_version("s", own, 600)
    settled = await store.load_version("s")
    assert settled.replay == () and settled.header["blocks"] == ["a", "c"] and settled.hidden == b"h2"
    assert [await _refs(store, b) for b in "abc"] == [1, None, 1]  # b: no version lists it any more
    assert not await store.settle_version("s", own, 600)  # settled already: nothing to do
    assert [await _refs(store, b) for b in "abc"] == [1, None, 1]


async def test_a_version_dropped_before_its_blocks_came_is_not_settled(store):
    await _create(store, _meta("s"), _write(1, ["a"], ["a"]))
    assert await _commit_write(store, "s", 2, _replay(2, [7], fed=2, keep=1))
    assert await _commit_write(store, "s", 3, _write(3, ["d"], ["d"], keep=1))
    assert not await store.settle_version("s", _write(2, ["a", "c"], ["c"]), 600)
    assert [await _refs(store, b) for b in "acd"] == [None, None, 1]  # c: nothing counts it, the sweeper's
