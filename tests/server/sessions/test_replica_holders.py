"""Replicas sharing one Redis in persistence `evict`: a session's memory lives in the replica that committed it
(its holder) until it is evicted or that replica shuts down. A starting replica never removes what a live
replica holds; what a dead one held (and did not save) is gone, and said to be; a graceful shutdown saves it.

Two runtimes in this process stand for two replicas (names differ by port, as two servers' do)."""

from __future__ import annotations

import contextlib

import pytest
import redis.asyncio as aioredis
from txl_server.errors import Gone, Unavailable
from txl_server.runtime import Runtime

OWNER = "tenant-a"


@contextlib.asynccontextmanager
async def replica(make_settings, prefix: str, port: int):
    rt = Runtime(make_settings(persistence="evict", redis_prefix=prefix, port=port))
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()


async def die(rt: Runtime) -> None:
    """As `kill -9` would leave it: no heartbeat any more, nothing saved (then its worker is stopped quietly)."""
    rt._heartbeat.cancel()
    for held in rt.service.cache.most_recent_first():  # its memory is gone with it
        rt.service.cache.drop(held)
    client = aioredis.from_url(rt.settings.redis_url)
    await client.delete(f"{rt.settings.redis_prefix}r:{rt.replica.name}")
    await client.aclose()


async def test_a_live_replicas_sessions_are_kept_and_a_dead_ones_are_gone(make_settings):
    prefix = make_settings().redis_prefix
    async with replica(make_settings, prefix, 18001) as a:
        held = await a.service.create(OWNER, text="held by a")
        async with replica(make_settings, prefix, 18002) as b:
            # b's start-up reconciliation left it, and b lists it: a can step it
            assert [m.id for m in await b.service.list_sessions(OWNER)] == [held.id]
            with pytest.raises(Unavailable, match="held by another server process"):
                await b.service.append(OWNER, held.id, "x")
            assert (await a.service.append(OWNER, held.id, " more")).session.version == held.version + 1
            await die(a)
            assert await b.service.list_sessions(OWNER) == []
            with pytest.raises(Gone, match="stopped without saving it"):
                await b.service.get(OWNER, held.id)
            with pytest.raises(Gone, match="stopped without saving it"):
                await b.service.append(OWNER, held.id, "x")
            await b.service.delete(OWNER, held.id)  # its owner can still tidy up


async def test_a_graceful_shutdown_hands_the_sessions_over(make_settings):
    prefix = make_settings().redis_prefix
    async with replica(make_settings, prefix, 18003) as b:
        async with replica(make_settings, prefix, 18004) as a:
            sessions = [await a.service.create(OWNER, text=f"session {i}") for i in range(3)]
        # a stopped: what it held is in Redis now
        for meta in sessions:
            outcome = await b.service.append(OWNER, meta.id, " continued")
            assert outcome.session.version == meta.version + 1


async def test_a_restarted_replica_replaces_its_killed_self_at_once(make_settings):
    """Same name (host and port): the earlier incarnation is dead without waiting for its heartbeat's TTL, its
    sessions are gone and the lease of the step it was in is freed."""
    prefix = make_settings().redis_prefix
    async with replica(make_settings, prefix, 18005) as first:
        held = await first.service.create(OWNER, text="held by the first")
        kept = await first.service.create(OWNER, text="evicted to Redis before the kill")
        await first.service.placement.spill(kept.id, first.service.cache.peek(kept.id))
        first._heartbeat.cancel()  # killed: its heartbeat key stays until its TTL
        client = aioredis.from_url(first.settings.redis_url)
        lease = f"{prefix}l:{kept.id}"
        await client.set(lease, f"{first.replica.id}/abc", px=60_000)  # a step cut by the kill
        async with replica(make_settings, prefix, 18005) as second:
            assert [m.id for m in await second.service.list_sessions(OWNER)] == [kept.id]
            with pytest.raises(Gone, match="stopped without saving it"):
                await second.service.get(OWNER, held.id)
            assert await client.get(lease) is None
            assert (await second.service.append(OWNER, kept.id, " on")).session.version == kept.version + 1
    # The first's late shutdown (it still had the session in its cache) did not bring it back.
    assert await client.hget(f"{prefix}s:{held.id}", "tier") == b"gone"
    await client.aclose()
