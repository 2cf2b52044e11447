"""Persistence: what a commit sends to Redis, and what it costs a small append.

A session of the bundled model with a full memory (mem_len positions) takes 5-byte appends, with persistence
`always` (every commit writes the memory's changed blocks with the metadata, atomically) and `none` (metadata
only), on the server's own embedded Redis. Bytes are Redis's own count of what it received
(`INFO stats total_net_input_bytes`) per append; latency is the service call, median of the appends.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from txl_server.check.benchmark_docs import Section
from txl_server.runtime import Runtime
from txl_server.sessions.store.blocks import BlockIndex, snapshot
from txl_server.settings import Persistence, Settings

OWNER = "bench"


async def measure(persistence: Persistence, appends: int) -> tuple[float, float, int, int]:
    """(median append seconds, median bytes to Redis per append, whole-memory bytes, block bytes)."""
    with tempfile.TemporaryDirectory(prefix="txl-bench-redis-") as data:
        runtime = Runtime(Settings(persistence=persistence, redis_data_dir=Path(data)))
        await runtime.start()
        try:
            service = runtime.service
            assert service is not None
            text = "It was the best of times, it was the worst of times. " * 12
            meta = await service.create(OWNER, text=text)
            entry = service.cache.peek(meta.id)
            assert entry is not None
            whole = snapshot(entry.state, BlockIndex()).nbytes
            block = entry.state.memory.pool.block_nbytes
            redis = service.store.redis
            seconds, sent = [], []
            for _ in range(appends):
                before = (await redis.info("stats"))["total_net_input_bytes"]
                started = time.perf_counter()
                await service.append(OWNER, meta.id, "Yes. ")
                seconds.append(time.perf_counter() - started)
                sent.append((await redis.info("stats"))["total_net_input_bytes"] - before)
            return statistics.median(seconds), statistics.median(sent), whole, block
        finally:
            await runtime.stop()


def run(quick: bool = False) -> Section:
    section = Section("persistence", "Persistence: bytes and time per commit", "python -m bench persistence")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    appends = 10 if quick else 40
    results = {}
    for _ in range(2):  # interleaved rounds: the machine's slow spells hit both modes
        for mode in (Persistence.NONE, Persistence.ALWAYS):
            latency, sent, whole, block = asyncio.run(measure(mode, appends))
            best = results.get(mode)
            if best is None or latency < best[0]:
                results[mode] = (latency, sent, whole, block)
    none, always = results[Persistence.NONE], results[Persistence.ALWAYS]
    section.table(
        "bundled model, a 5-byte append to a full session (mem_len 512)",
        ["persistence", "append (ms)", "KiB to Redis per append", "x none"],
        [
            ["none", none[0] * 1000, none[1] / 1024, 1.0],
            ["always", always[0] * 1000, always[1] / 1024, always[0] / none[0]],
        ],
    )
    section.note(
        f"The whole memory is {always[2] / 2**20:.1f} MiB ({always[3] / 1024:.0f} KiB per block of 16 positions): "
        "what every commit wrote before blocks. Targets: well under 1 MiB per small append, and within 1.5x of "
        "`none`."
    )
    return section
