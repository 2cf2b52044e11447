"""Creating and deleting sessions leaks nothing: neither process memory nor Redis keys."""

from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid

import httpx
import pytest
import redis as redis_client

from tests.helpers.server_process import ServerProcess

pytestmark = pytest.mark.slow

SESSIONS = int(os.environ.get("TXL_LEAK_SESSIONS", "1200"))
WARMUP = 300
CONCURRENCY = 8


async def _create_and_delete(server: ServerProcess, n: int, offset: int) -> int:
    """Creates and deletes `n` sessions, CONCURRENCY at a time; returns how many round trips failed."""
    failures = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(offset + i)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failures
        while not queue.empty():
            i = queue.get_nowait()
            body = {"text": f"Session {i} lives briefly. " * 2, "metadata": {"n": i}}
            created = await client.post("/v1/sessions", json=body)
            if created.status_code != 201:
                failures += 1
                continue
            sid = created.json()["id"]
            if i % 4 == 0:  # some take a step first: memory grows, a snapshot is written
                await client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 4})
            if (await client.delete(f"/v1/sessions/{sid}")).status_code != 204:
                failures += 1

    async with server.async_client(limits=httpx.Limits(max_connections=CONCURRENCY)) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return failures


def test_creating_and_deleting_sessions_leaks_no_memory_and_no_redis_keys(make_server, redis_server, figures):
    prefix = f"leak-{uuid.uuid4().hex[:6]}:"
    # No prefix cache: what it keeps (up to its budget) would read as growth here; its own bounds are tested apart.
    server = make_server(TXL_REDIS_PREFIX=prefix, TXL_PERSISTENCE="always", TXL_PREFIX_CACHE_BYTES="0")
    started_rss = server.rss_bytes()
    assert asyncio.run(_create_and_delete(server, WARMUP, 0)) == 0
    gc.collect()
    time.sleep(0.5)
    before = server.rss_bytes()
    started = time.monotonic()
    assert asyncio.run(_create_and_delete(server, SESSIONS, WARMUP)) == 0
    seconds = time.monotonic() - started
    time.sleep(0.5)
    after = server.rss_bytes()

    store = redis_client.Redis.from_url(redis_server.url)
    try:
        keys = [key.decode() for key in store.scan_iter(match=f"{prefix}*", count=1000)]
        # Not a session's: the running server's own heartbeat (r:{host}:{port}), the store's identity and the
        # block sweeper's lock (one key each, whatever the load), and the deleted sessions' marks (d:{id}, a byte
        # each, gone when the sessions would have expired: sessions/acked.py).
        kept = (f"{prefix}r:", f"{prefix}d:", f"{prefix}store", f"{prefix}sweep")
        leftover = [key for key in keys if not key.startswith(kept)]
    finally:
        store.close()
    with server.client() as client:
        text = client.get("/metrics").text
        listed = client.get("/v1/sessions").json()["data"]
    figures.record(
        "leaks",
        {
            "sessions_created_and_deleted": SESSIONS,
            "warmup_sessions": WARMUP,
            "rss_at_start_mib": round(started_rss / 2**20, 1),
            "rss_after_warmup_mib": round(before / 2**20, 1),
            "rss_after_mib": round(after / 2**20, 1),
            "rss_growth_percent": round(100 * (after - before) / before, 2),
            "leftover_redis_keys": len(leftover),
            "seconds": round(seconds, 1),
            "sessions_per_second": round(SESSIONS / seconds, 1),
        },
    )
    assert listed == []
    assert 'txl_sessions{tier="device"} 0.0' in text and 'txl_memory_bytes{tier="device"} 0.0' in text
    assert not leftover, leftover[:20]
    assert after <= before * 1.10, (before, after)
