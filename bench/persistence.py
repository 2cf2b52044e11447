"""Sessions at rest: what each costs Redis and the block store, and what a commit costs.

With persistence `always` every commit writes its metadata to Redis (the server's private Redis, with its
append-only file) and the session's new blocks to the block store (a directory here, on this machine's disk): a
short step's before its answer as the token ids it fed, its blocks just after (write-behind: docs/server.md);
Redis holds headers and block references, the block store the bytes. Sessions are created with text enough to
fill their memory (`mem_len` positions), then left at rest (their blocks written); per session: Redis's
`used_memory` growth (everything it holds, allocator overhead included) and the block store's bytes on disk; then
short appends to one session, each timed alone: the commit the answer waits for (one Redis round trip), the
blocks written behind it (then the version settled in Redis: a second round trip), and the whole append. For the
bundled model and for the wt103 shape (random weights, bfloat16 where this CPU computes it natively; what a GPU
would serve), whose sessions are 14 times larger. The figure before the block store is the issue's measurement
(9.6 MiB of Redis per bundled session at rest).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis as redis_sync
from txl.kernels.cpu.linear import cpu_runs_bfloat16
from txl_server.check.benchmark_docs import Section
from txl_server.runtime import Runtime
from txl_server.sessions.redis_server import EmbeddedRedis, free_port
from txl_server.sessions.step import Steps
from txl_server.settings import Settings

from .common import percentile
from .engine import WordIds
from .paper_table9 import wt103_model

OWNER = "bench"
GIB = 1024**3


@dataclass
class Figures:
    sessions: int
    redis_bytes: float  # Redis used_memory growth per session at rest
    redis_total: int  # Redis used_memory with every session at rest
    store_bytes: float  # block store bytes per session
    commit_ms: list[float]  # each commit alone (what the answer waits for)
    append_ms: list[float]
    behind_ms: list[float]  # each version's blocks written after the answer, and the version settled


def _disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def measure(settings: Settings, text: str, sessions: int, appends: int, loaded: Any = None) -> Figures:
    blocks = Path(settings.block_store or "")
    runtime = Runtime(settings, loaded=loaded)
    await runtime.start()
    try:
        service = runtime.service
        assert service is not None
        redis = service.store.redis
        # A first session, not counted: what Redis keeps once whatever the sessions (the scripts it loads, the
        # store's identity, the tenant's count) is in place before the sessions at rest are counted.
        await service.create(OWNER, text=f"first: {text}")
        before, stored_before = (await redis.info("memory"))["used_memory"], _disk_bytes(blocks)
        ids = [(await service.create(OWNER, text=f"{i}: {text}")).id for i in range(sessions)]
        await service.persistence.settled(600)  # at rest: their blocks written
        after = (await redis.info("memory"))["used_memory"]
        stored = _disk_bytes(blocks) - stored_before
        commit_ms: list[float] = []
        original = Steps.commit

        async def timed(self: Steps, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await original(self, *args, **kwargs)
            finally:
                commit_ms.append((time.perf_counter() - started) * 1000)

        append_ms, behind_ms = [], []
        Steps.commit = timed  # type: ignore[method-assign]
        try:
            for _ in range(appends):
                started = time.perf_counter()
                await service.append(OWNER, ids[0], " Yes.")
                append_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                await service.persistence.settled(60)  # its blocks, at once rather than 50 ms later
                behind_ms.append((time.perf_counter() - started) * 1000)
        finally:
            Steps.commit = original  # type: ignore[method-assign]
        per_session = (after - before) / sessions
        return Figures(sessions, per_session, after, stored / sessions, commit_ms, append_ms, behind_ms)
    finally:
        await runtime.stop()


async def measure_wait(settings: Settings, text: str, appends: int) -> dict[int, list[float]]:
    """Commit milliseconds with a replica attached (on loopback), waiting for it (WAIT 1) or not, alternately."""
    runtime = Runtime(settings)
    await runtime.start()
    replica = EmbeddedRedis(Path(str(settings.redis_data_dir)).parent / "replica", port=free_port())
    replica.start()
    original = Steps.commit
    try:
        assert runtime.embedded_redis is not None and runtime.service is not None
        master = runtime.embedded_redis.port
        redis_sync.Redis(port=replica.port).replicaof("127.0.0.1", master)
        while redis_sync.Redis(port=master).info("replication")["connected_slaves"] < 1:
            await asyncio.sleep(0.05)
        service = runtime.service
        session = await service.create(OWNER, text=text)
        commit_ms: list[float] = []

        async def timed(self: Steps, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await original(self, *args, **kwargs)
            finally:
                commit_ms.append((time.perf_counter() - started) * 1000)

        Steps.commit = timed  # type: ignore[method-assign]
        timings: dict[int, list[float]] = {0: [], 1: []}
        for i in range(2 * appends):
            service.store.wait_replicas = i % 2
            await service.append(OWNER, session.id, " Yes.")
            timings[i % 2].append(commit_ms[-1])
        return timings
    finally:
        Steps.commit = original  # type: ignore[method-assign]
        replica.stop()
        await runtime.stop()


def _settings(data: Path, **overrides: Any) -> Settings:
    return Settings(
        redis_data_dir=data / "redis", block_store=str(data / "blocks"), persistence="always", **overrides
    )


def run(quick: bool = False) -> Section:
    section = Section(
        "persistence", "Sessions at rest: Redis, the block store, and a commit", "python -m bench persistence"
    )
    section.note(__doc__.split("\n\n", 1)[1].strip())
    rows = []
    bundled_text = "It was the best of times, it was the worst of times. " * 30  # 1,590 bytes: a full memory
    with tempfile.TemporaryDirectory(prefix="txl-bench-persistence-") as data:
        sessions = 100 if quick else 500
        bundled = asyncio.run(measure(_settings(Path(data) / "bundled"), bundled_text, sessions, 40))
        rows.append(("bundled model, float32, mem_len 512", bundled))
    dtype = "bfloat16" if cpu_runs_bfloat16() else "float32"
    wt103_text = "the " * 1700  # WordIds: a token per character; a full memory of 1,600 positions
    with tempfile.TemporaryDirectory(prefix="txl-bench-persistence-") as data:
        model = wt103_model().to(dtype=getattr(__import__("torch"), dtype))
        settings = _settings(Path(data) / "wt103", dtype=dtype, model_id="wt103-random")
        loaded = (model, WordIds(), "wt103-random")
        wt103 = asyncio.run(measure(settings, wt103_text, 2 if quick else 8, 10 if quick else 20, loaded))
        rows.append((f"wt103 shape (random weights), {dtype}, mem_len 1,600", wt103))
    section.table(
        "per session at rest, and each commit of a short append to a full session",
        [
            "model",
            "sessions",
            "Redis KiB / session",
            "block store MiB / session",
            "sessions / GiB of Redis",
            "commit p50 (ms)",
            "commit p99 (ms)",
            "blocks behind p50 (ms)",
            "append p50 (ms)",
        ],
        [
            [
                name,
                f.sessions,
                f.redis_bytes / 1024,
                f.store_bytes / 2**20,
                int(GIB / f.redis_bytes),
                statistics.median(f.commit_ms),
                percentile(f.commit_ms, 99),
                statistics.median(f.behind_ms),
                statistics.median(f.append_ms),
            ]
            for name, f in rows
        ],
    )
    with tempfile.TemporaryDirectory(prefix="txl-bench-persistence-") as data:
        waits = asyncio.run(measure_wait(_settings(Path(data) / "wait"), bundled_text, 10 if quick else 40))
    section.table(
        "a commit with a replica attached (loopback), waiting for it to acknowledge (Redis WAIT) or not (ms)",
        ["commit waits for", "p50", "p99"],
        [
            [f"{n} replica{'s' if n != 1 else ''}", statistics.median(waits[n]), percentile(waits[n], 99)]
            for n in (0, 1)
        ],
    )
    section.note(
        f"Redis with all {bundled.sessions} bundled sessions at rest: {bundled.redis_total / 2**20:.1f} MiB used "
        "(targets: at most 16 KiB per session at rest, and under 16 MiB for 500 sessions; before the block store, "
        "9.6 MiB per session)."
    )
    return section
