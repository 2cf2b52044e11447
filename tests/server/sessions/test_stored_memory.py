"""Stored memories in a real Redis: versions list blocks shared by reference (their bytes in the block store,
sessions/blocks/); a block's references are written once and go when no kept version of any session lists it."""

from __future__ import annotations

import json
import uuid

import pytest
from redis import asyncio as aioredis
from txl_server.sessions.store.blocks import StoredVersion
from txl_server.sessions.store.lease import Lease, new_token
from txl_server.sessions.store.plumbing import now
from txl_server.sessions.store.sessions import SessionMeta, SessionStore
from txl_server.sessions.store.versions import BlocksMissing, Replay, VersionSummary, VersionWrite


@pytest.fixture
async def store(redis_server):
    client = aioredis.from_url(redis_server.url)
    yield SessionStore(client, prefix=f"test-{uuid.uuid4().hex[:8]}:")
    await client.aclose()


def _meta(session_id: str, version: int = 1) -> SessionMeta:
    stamp = now()
    return SessionMeta(session_id, "owner", stamp, stamp, 600, 32, "m", tokens=version, version=version)


def _write(
    version: int, blocks: list[str], new: list[str], keep: int = 32, written_at: float | None = None
) -> VersionWrite:
    header = {"format": 4, "blocks": blocks, "fed": version}
    stored = StoredVersion(header, b"h%d" % version, {b: f"data-{b}".encode() for b in new})
    summary = VersionSummary(version, version, now(), "append", f"v{version}")
    return VersionWrite(stored, summary, keep, now() if written_at is None else written_at)


async def _refs(store: SessionStore, block: str) -> int | None:
    value = await store.redis.hget(store.keys.blocks + block, "n")
    return None if value is None else int(value)


async def _lease(store: SessionStore, session_id: str) -> Lease:
    """The session's lease, taken as a step takes it."""
    lease = Lease(session_id, new_token("test"), 10.0)
    assert await store.redis.set(store.keys.lease(session_id), lease.token, nx=True, px=lease.ttl_ms)
    return lease


async def _create(store: SessionStore, meta: SessionMeta, write: VersionWrite) -> None:
    lease = Lease(meta.id, new_token("test"), 10.0)
    assert await store.reserve(meta.owner, meta.id, limit=100, lease=lease)
    await store.create(meta, write, lease=lease)


async def _delete(store: SessionStore, meta: SessionMeta) -> None:
    await store.delete(meta, lease=await _lease(store, meta.id))


async def _commit(store, session_id, version, blocks, new, keep=32):
    return await _commit_write(store, session_id, version, _write(version, blocks, new, keep))


async def _commit_write(store, session_id, version, write):
    return await store.commit(
        _meta(session_id, version),
        expected_version=version - 1,
        lease=await _lease(store, session_id),
        write=write,
    )


async def test_versions_share_blocks_and_a_block_goes_with_its_last_reference(store):
    await _create(store, _meta("s"), _write(1, ["a", "b"], ["a", "b"]))
    assert await _commit(store, "s", 2, ["a", "c"], ["c"])
    assert [await _refs(store, b) for b in "abc"] == [2, 1, 1]
    first = await store.load_version("s", 1)
    assert first.header["blocks"] == ["a", "b"] and first.hidden == b"h1" and first.header["fed"] == 1
    assert first.blocks == [b"", b""]  # their bytes are in the block store, not in Redis
    newest = await store.load_version("s")
    assert newest.version == 2 and newest.header["blocks"] == ["a", "c"]
    # Keeping two versions: the third pushes the first out, and b (listed only by it) goes.
    assert await _commit(store, "s", 3, ["a", "d"], ["d"], keep=2)
    assert [await _refs(store, b) for b in "abcd"] == [2, None, 1, 1]
    assert await store.load_version("s", 1) is None
    assert [v.version for v in await store.versions("s")] == [2, 3]
    assert (await store.versions("s"))[-1].text_tail == "v3"


async def test_a_fork_lists_its_parents_blocks_and_outlives_it(store):
    await _create(store, _meta("p"), _write(1, ["a", "b"], ["a", "b"]))
    await _create(store, _meta("f"), _write(1, ["a", "b"], []))  # nothing written: both blocks listed
    assert [await _refs(store, b) for b in "ab"] == [2, 2]
    await _delete(store, _meta("p"))
    assert [await _refs(store, b) for b in "ab"] == [1, 1]
    assert (await store.load_version("f")).header["blocks"] == ["a", "b"]
    await _delete(store, _meta("f"))
    assert [await _refs(store, b) for b in "ab"] == [None, None]
    # What stays: the deleted marks (until the sessions would have expired) and the store's identity.
    left = sorted(k.decode().removeprefix(store.prefix) for k in await store.redis.keys(store.prefix + "*"))
    assert left == ["d:f", "d:p", "store"]


async def test_a_version_listing_a_block_the_store_lacks_writes_nothing(store):
    await _create(store, _meta("s"), _write(1, ["a"], ["a"]))
    with pytest.raises(BlocksMissing) as missing:
        await _commit(store, "s", 2, ["a", "zz"], [])
    assert missing.value.ids == {"zz"}
    assert (await store.get("s")).version == 1 and await _refs(store, "a") == 1
    with pytest.raises(BlocksMissing):
        await _create(store, _meta("t"), _write(1, ["gone"], []))
    assert await store.get("t") is None


async def test_a_version_whose_new_blocks_were_written_long_ago_is_refused_whole(store):
    """Its blocks may have been collected by the block store's sweeper, taken for a crashed writer's."""
    await _create(store, _meta("s"), _write(1, ["a"], ["a"]))
    with pytest.raises(BlocksMissing) as stale:
        await _commit_write(store, "s", 2, _write(2, ["a", "b"], ["b"], written_at=now() - 60))
    assert stale.value.ids == set()
    assert (await store.get("s")).version == 1 and await _refs(store, "b") is None


async def test_an_older_servers_blocks_keep_their_bytes_in_redis_until_they_move(store):
    await _create(store, _meta("s"), _write(1, ["a"], ["a"]))
    await store.redis.hset(store.keys.blocks + "a", "d", b"bytes kept by an older server")
    assert (await store.load_version("s")).blocks == [b"bytes kept by an older server"]
    legacy = [found async for found in store.legacy_blocks()]
    assert legacy == [{"a": b"bytes kept by an older server"}]
    assert await store.drop_legacy_data(["a"]) == 1
    assert (await store.load_version("s")).blocks == [b""] and await _refs(store, "a") == 1


async def test_blocks_live_at_least_as_long_as_every_memory_listing_them(store):
    await _create(store, _meta("s"), _write(1, ["a"], ["a"]))
    long_lived = _meta("l")
    long_lived.ttl_seconds = 5000
    await _create(store, long_lived, _write(1, ["a"], []))
    assert await store.redis.ttl(store.keys.blocks + "a") > 4000
    await _commit(store, "s", 2, ["a"], [])  # a shorter-lived commit never shortens it
    assert await store.redis.ttl(store.keys.blocks + "a") > 4000


async def test_a_version_listing_another_sessions_block_makes_it_live_as_long_as_itself(store):
    short = _meta("o")
    short.ttl_seconds = 60
    await _create(store, short, _write(1, ["x"], ["x"]))
    await _create(store, _meta("s"), _write(1, ["a"], ["a"]))  # its blocks live 600 s (and the margin)
    await _commit(store, "s", 2, ["a", "x"], [])  # a block only the short-lived session's version listed
    assert await store.redis.ttl(store.keys.blocks + "x") >= 600


async def _script_ttl_calls(store: SessionStore) -> int:
    stats = await store.redis.info("commandstats")
    return int(stats.get("cmdstat_ttl", {}).get("calls", 0))


async def test_steps_within_the_margin_touch_no_block_and_then_every_block_outlives_its_versions(store):
    """A session's blocks are extended once per EXTEND_MARGIN (lua/versions.lua's `t`), not at every step."""
    await _create(store, _meta("s"), _write(1, ["a", "b"], ["a", "b"]))
    before = await _script_ttl_calls(store)
    for version in (2, 3):
        assert await _commit_write(store, "s", version, _replay(version, [version], fed=version))
    assert await _script_ttl_calls(store) == before
    for block in "ab":
        assert await store.redis.ttl(store.keys.blocks + block) >= 600
    # Once the margin has passed (here: `t` moved back, and the blocks' own TTLs with it), a step extends them.
    await store.redis.hset(store.keys.versions("s"), "t", 0)
    for block in "ab":
        await store.redis.expire(store.keys.blocks + block, 5)
    assert await _commit_write(store, "s", 4, _replay(4, [4], fed=4))
    for block in "ab":
        assert 600 <= await store.redis.ttl(store.keys.blocks + block) <= 630
    assert 595 <= await store.redis.ttl(store.keys.versions("s")) <= 600


async def test_a_memory_an_older_server_stored_still_loads(store):
    header = {"format": 2, "blocks": 1, "first": 0}
    await store.redis.hset(
        store.keys.versions("old"), mapping={"v": "4", "header": json.dumps(header), "b:0": b"x"}
    )
    legacy = await store.load_version("old")
    assert legacy.version == 4 and legacy.legacy_blocks == {0: b"x"} and legacy.header["format"] == 2
    # Its first commit in the new format replaces it whole.
    await store.redis.hset(store.keys.session("old"), mapping=_meta("old", 4).to_redis())
    assert await _commit(store, "old", 5, ["n"], ["n"])
    assert (await store.load_version("old")).header["blocks"] == ["n"]
    assert not await store.redis.hexists(store.keys.versions("old"), "b:0")


def _replay(version: int, tokens: list[int], fed: int) -> Replay:
    return Replay(VersionSummary(version, fed, now(), "append", f"v{version}"), tuple(tokens), fed, 32, 64)
