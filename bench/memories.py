"""Preloaded memories: a session from a 200 KiB document, read cold or started from a memory; device bytes of many
sessions sharing one memory or each holding their own.

The bundled model (float32, mem_len 512) in process, on an embedded Redis. The document is the five Gutenberg
excerpts of tests/data (200 KiB, one token per byte). "Cold" creates a session with the document as its text
(every token is computed); "from a memory" creates one with `memory` (the memory's state is shared: its table,
no copy, no recompute), alone or followed by a 40-byte question. "First use on a new replica" is a second process
on the same Redis starting its first session from the memory (it reads the memory's blocks from Redis once).
Session times are medians of repeated creates; device bytes are the service's own exact count (sessions' blocks
and hidden states, shared ones counted once), after the sessions were created.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from txl_server.check.benchmark_docs import Section
from txl_server.runtime import Runtime
from txl_server.sessions.redis_server import EmbeddedRedis
from txl_server.sessions.state_cache import DEVICE
from txl_server.settings import Settings

from .common import ROOT

OWNER = "bench"
QUESTION = "\n\nQ: Who is the first person named here?\nA:"


def document(limit: int) -> str:
    books = sorted((ROOT / "tests" / "data" / "gutenberg").glob("*.txt"))
    return "".join(path.read_text(encoding="utf-8") for path in books)[:limit]


async def _timed(make) -> tuple[float, object]:
    started = time.perf_counter()
    result = await make()
    return time.perf_counter() - started, result


async def measure(doc: str, repeats: int, sessions: int, excerpt: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="txl-bench-redis-") as data, EmbeddedRedis(Path(data)) as redis:
        settings = Settings(redis_url=redis.url)
        first = Runtime(settings)
        await first.start()
        try:
            service = first.service
            assert service is not None
            out["cold"], cold = await _timed(lambda: service.create(OWNER, text=doc))
            out["memory_create"], memory = await _timed(lambda: service.memories.create(OWNER, doc))
            entry = service.cache.peek(cold.id)
            assert entry is not None
            out["session_bytes"] = entry.state.nbytes
            await service.delete(OWNER, cold.id)
            times, with_question = [], []
            for _ in range(repeats):
                seconds, made = await _timed(lambda: service.create(OWNER, memory=memory.id))
                times.append(seconds)
                await service.delete(OWNER, made.id)
                seconds, made = await _timed(lambda: service.create(OWNER, memory=memory.id, text=QUESTION))
                with_question.append(seconds)
                await service.delete(OWNER, made.id)
            out["from_memory"] = statistics.median(times)
            out["from_memory_question"] = statistics.median(with_question)

            # Device bytes: `sessions` from the memory, then `sessions` that each read an excerpt (as long a
            # window as the whole document: a memory's size does not depend on what it read beyond mem_len).
            base = service.cache.used(DEVICE)
            shared = [await service.create(OWNER, memory=memory.id, text=QUESTION) for _ in range(sessions)]
            held = service.cache.peek(memory.id)
            assert held is not None
            out["shared_bytes"] = service.cache.used(DEVICE) - base + held.state.nbytes  # + the memory's own
            for meta in shared:
                await service.delete(OWNER, meta.id)
            base = service.cache.used(DEVICE)
            own = [await service.create(OWNER, text=doc[:excerpt] + QUESTION) for _ in range(sessions)]
            out["own_bytes"] = service.cache.used(DEVICE) - base
            out["excerpt_session_bytes"] = service.cache.peek(own[0].id).state.nbytes  # type: ignore[union-attr]
            for meta in own:
                await service.delete(OWNER, meta.id)

            replica = Runtime(settings)
            await replica.start()
            try:
                assert replica.service is not None
                out["replica_first"], _ = await _timed(
                    lambda: replica.service.create(OWNER, memory=memory.id)  # type: ignore[union-attr]
                )
            finally:
                await replica.stop()
        finally:
            await first.stop()
    return out


def run(quick: bool = False) -> Section:
    section = Section("memories", "Preloaded memories: read once, start many", "python -m bench memories")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    size = 20 * 1024 if quick else 200 * 1024
    sessions = 10 if quick else 100
    doc = document(size)
    r = asyncio.run(measure(doc, repeats=5 if quick else 20, sessions=sessions, excerpt=1024))
    kib = len(doc.encode()) / 1024
    section.table(
        f"bundled model, a session from a {kib:.0f} KiB document",
        ["how", "ms", "x from a memory"],
        [
            ["cold: the document as the session's text", r["cold"] * 1000, r["cold"] / r["from_memory"]],
            ["from a memory", r["from_memory"] * 1000, 1.0],
            ["from a memory, then a 40-byte question", r["from_memory_question"] * 1000,
             r["from_memory_question"] / r["from_memory"]],
            ["from a memory, first use on a new replica", r["replica_first"] * 1000,
             r["replica_first"] / r["from_memory"]],
            ["(once) creating the memory", r["memory_create"] * 1000, r["memory_create"] / r["from_memory"]],
        ],
    )  # fmt: skip
    mib = 2**20
    section.table(
        f"device bytes of {sessions} sessions (each then asked a 40-byte question)",
        ["sessions", "MiB on the device", "MiB per session"],
        [
            [f"{sessions} from one memory (the memory included)", r["shared_bytes"] / mib,
             r["shared_bytes"] / sessions / mib],
            [f"{sessions} that each read the document", r["own_bytes"] / mib, r["own_bytes"] / sessions / mib],
        ],
    )  # fmt: skip
    section.note(
        f"A session's memory is a window of mem_len positions plus its last position's offset in its segment, "
        f"whatever it read before: {r['session_bytes'] / mib:.2f} MiB after the whole {kib:.0f} KiB document, "
        f"{r['excerpt_session_bytes'] / mib:.2f} MiB after its first 1 KiB and the question (which ends at the "
        "same offset as the whole document and the question). So the sessions that each read it were fed the "
        "1 KiB excerpt, at the same bytes and a 200th of the time. A session from a memory adds only what its own "
        "text needs: the block its question starts in (copied on write: the memory's last block is shared), the "
        "blocks after it, and a hidden state."
    )
    return section
