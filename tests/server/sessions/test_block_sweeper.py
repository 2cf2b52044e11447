"""The block sweeper with a real Redis: it collects a block no version references once it is older than the
grace period, never one a version references nor one a commit may still be about to reference, holds off after
Redis lost data, and sweeps on one replica at a time."""

from __future__ import annotations

import os
import uuid

import pytest
from redis import asyncio as aioredis
from txl_server.sessions.blocks.directory import DirectoryBackend
from txl_server.sessions.blocks.store import BlockStore, Marker, block_key
from txl_server.sessions.blocks.sweeper import BLOCK_GRACE_SECONDS, BlockSweeper
from txl_server.sessions.store.plumbing import now
from txl_server.sessions.store.sessions import SessionStore


@pytest.fixture
async def store(redis_server):
    client = aioredis.from_url(redis_server.url)
    yield SessionStore(client, prefix=f"sweep-{uuid.uuid4().hex[:8]}:")
    await client.aclose()


@pytest.fixture
def blocks(tmp_path) -> BlockStore:
    store = BlockStore(DirectoryBackend(tmp_path))
    store.bind("s")
    return store


def _age(blocks: BlockStore, block: str, seconds: float) -> None:
    path = blocks.backend.root / "s" / block_key(block)  # type: ignore[attr-defined]
    when = now() - seconds
    os.utime(path, (when, when))


async def _left(blocks: BlockStore) -> set[str]:
    return {block async for block, _ in blocks.blocks()}


async def test_only_old_blocks_no_version_references_are_collected(store, blocks):
    await blocks.write({"named": b"1", "dead": b"2", "young": b"3"})
    await store.redis.hset(store.keys.blocks + "named", "n", 1)
    for block in ("named", "dead"):
        _age(blocks, block, BLOCK_GRACE_SECONDS + 5)
    _age(blocks, "young", BLOCK_GRACE_SECONDS - 10)  # a commit may still list it
    swept = await BlockSweeper(blocks, store, hold_seconds=3600).sweep()
    assert (swept.examined, swept.collected) == (2, 1)
    assert await _left(blocks) == {"named", "young"}


async def test_the_sweeper_holds_off_after_the_session_store_lost_data(store, blocks):
    await blocks.write({"orphan": b"1"})
    _age(blocks, "orphan", BLOCK_GRACE_SECONDS + 5)
    await blocks.write_marker(Marker("s", loss_at=now()))
    swept = await BlockSweeper(blocks, store, hold_seconds=3600).sweep()
    assert swept.held and await _left(blocks) == {"orphan"}
    assert (await BlockSweeper(blocks, store, hold_seconds=0).sweep()).collected == 1


async def test_one_replica_sweeps_at_a_time(store, blocks):
    await blocks.write({"orphan": b"1"})
    _age(blocks, "orphan", BLOCK_GRACE_SECONDS + 5)
    first, second = BlockSweeper(blocks, store, hold_seconds=0), BlockSweeper(blocks, store, hold_seconds=0)
    assert await store.take_sweep_lock(first._token, 60_000)
    assert (await second.sweep()).examined == 0 and await _left(blocks) == {"orphan"}
    assert (await first.sweep()).collected == 1
