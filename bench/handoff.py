"""Hand-off: what a session costs when it moves to another replica (a scale event, a drain, a rolling update)
against staying on the one that served it last.

Two replicas (two runtimes in this process, each with its own worker and memory pool, sharing the model's
weights) on one Redis, with persistence `always`. Redis runs without its append-only file: what a move reads does
not depend on it, and on a loaded 2-core machine writing a whole wt103 float32 memory (227 MiB) through the file
took longer than the server's 5 s Redis timeout. A session with a full memory (its `mem_len` positions) takes
one-token generations, alternately two on one replica and two on the other: the first of each pair is a move (the
replica's copy, if any, is older than Redis's: it reads the committed snapshot and copies it into its pool), the
second stays put (the memory is in the pool already). Time to first token is the service call from its start to
the token (no HTTP); bytes are what Redis sent during the call (`INFO stats total_net_output_bytes`, less what the
INFO itself takes). Medians of the rounds.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from txl import peak_positions
from txl.kernels.cpu import linear
from txl.sampling import SamplingParams
from txl.tokenizers import Tokenizer
from txl_server.check.benchmark_docs import Section
from txl_server.engine.jobs import TokenEvent
from txl_server.runtime import LoadedModel, Runtime
from txl_server.sessions.redis_server import EmbeddedRedis
from txl_server.sessions.service import SessionService
from txl_server.settings import Persistence, Settings

from .engine import WordIds, bundled_model
from .paper_table9 import wt103_model

OWNER = "bench"
GREEDY = SamplingParams(temperature=0.0)


@dataclass
class Step:
    ttft: float  # seconds from the call to its first token
    total: float  # seconds to the committed result
    redis_bytes: int  # bytes Redis sent during the call


async def _redis_output(service: SessionService) -> int:
    return int((await service.store.redis.info("stats"))["total_net_output_bytes"])


async def _one_token(service: SessionService, session_id: str, info_bytes: int) -> Step:
    before = await _redis_output(service)
    started = time.perf_counter()
    ttft = None
    async for event in service.generate(OWNER, session_id, max_tokens=1, sampling=GREEDY):
        if isinstance(event, TokenEvent) and ttft is None:
            ttft = time.perf_counter() - started
    total = time.perf_counter() - started
    sent = await _redis_output(service) - before - info_bytes
    assert ttft is not None
    return Step(ttft, total, sent)


async def measure(loaded: LoadedModel, text: str, rounds: int) -> tuple[list[Step], list[Step]]:
    """(moves, stays) of a session of `text` moving between two replicas."""
    model = loaded[0]
    layout = model.memory_layout()
    mem_len = model.config.mem_len
    peak_bytes = peak_positions(mem_len, model.config.segment_len) * layout.bytes_per_position()
    with (
        tempfile.TemporaryDirectory(prefix="txl-bench-handoff-") as data,
        EmbeddedRedis(Path(data), appendonly=False) as redis,
    ):
        settings = Settings(
            redis_url=redis.url,
            redis_prefix="handoff:",
            persistence=Persistence.ALWAYS,
            device_memory_bytes=3 * peak_bytes,  # the session at its peak, and room to spare
            host_memory_bytes=3 * peak_bytes,
            threads=torch.get_num_threads(),
        )
        replicas = [Runtime(settings, loaded=loaded) for _ in range(2)]
        for runtime in replicas:
            await runtime.start()
        try:
            services = [r.service for r in replicas]
            assert services[0] is not None and services[1] is not None
            first = services[0]
            # What one INFO reply adds to the count it reports on the next call.
            info_bytes = -(await _redis_output(first)) + await _redis_output(first)
            session = await first.create(OWNER, text=text)
            assert session.mem_tokens == mem_len, (session.mem_tokens, mem_len)
            moves, stays = [], []
            stays.append(await _one_token(first, session.id, info_bytes))
            for i in range(rounds):
                service = services[(i + 1) % 2]
                moves.append(await _one_token(service, session.id, info_bytes))
                stays.append(await _one_token(service, session.id, info_bytes))
            return moves, stays
        finally:
            for runtime in replicas:
                await runtime.stop()


def _median(steps: list[Step], field: str) -> float:
    return statistics.median(getattr(s, field) for s in steps)


def _case(label: str, dtype: str, loaded: LoadedModel, text: str, rounds: int) -> list[object]:
    moves, stays = asyncio.run(measure(loaded, text, rounds))
    model = loaded[0]
    mem_len = model.config.mem_len
    memory_mib = mem_len * model.memory_layout().bytes_per_position() / 2**20
    move_ttft, stay_ttft = _median(moves, "ttft"), _median(stays, "ttft")
    return [
        label,
        dtype,
        mem_len,
        memory_mib,
        _median(moves, "redis_bytes") / 2**20,
        _median(stays, "redis_bytes") / 1024,
        stay_ttft * 1000,
        move_ttft * 1000,
        (move_ttft - stay_ttft) * 1000,
        move_ttft / stay_ttft,
    ]


def _text_for(tokenizer: Tokenizer, tokens: int) -> str:
    """A text of at least `tokens` tokens for `tokenizer`."""
    line = "It was the best of times, it was the worst of times, it was the age of wisdom. "
    text = line
    while len(tokenizer.encode(text)) < tokens:
        text += line
    return text


def run(quick: bool = False) -> Section:
    section = Section("handoff", "Hand-off: a session moving between replicas", "python -m bench handoff")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    rounds = 2 if quick else 5
    rows = []
    small, tokenizer, label = bundled_model()
    cases: list[tuple[str, str, LoadedModel]] = [(label, "float32", (small, tokenizer, "bundled"))]
    native_bf16 = linear.cpu_runs_bfloat16()
    big = wt103_model().eval()
    words = WordIds()
    cases.append(("wt103 shape (random weights)", "float32", (big, words, "wt103")))  # type: ignore[arg-type]
    for name, dtype, loaded in cases:
        text = _text_for(loaded[1], loaded[0].config.mem_len + loaded[0].config.segment_len)
        rows.append(_case(name, dtype, loaded, text, rounds))
    if native_bf16:
        for name, model, tok in ((label, small, tokenizer), ("wt103 shape (random weights)", big, words)):
            model.to(torch.bfloat16)
            loaded = (model, tok, name)
            text = _text_for(tok, model.config.mem_len + model.config.segment_len)  # type: ignore[arg-type]
            rows.append(_case(name, "bfloat16", loaded, text, rounds))  # type: ignore[arg-type]
    section.table(
        "one-token generation on a session with a full memory: moved to the other replica against staying put",
        [
            "model",
            "dtype",
            "mem_len",
            "memory MiB",
            "MiB from Redis (move)",
            "KiB from Redis (stay)",
            "TTFT stay (ms)",
            "TTFT move (ms)",
            "move costs (ms)",
            "x stay",
        ],
        rows,
    )
    if not native_bf16:
        section.note(
            "bfloat16 not measured: this CPU computes it without native instructions (hundreds of times slower "
            "than float32), where the server refuses it."
        )
    section.note(
        "A scale event moves about 1/N of the sessions (consistent hashing, N replicas after the event); each "
        "moved session pays the move once, on its next request, and stays put afterwards. The memory read is "
        "the session's blocks (mem_len positions); on a GPU the copy into the pool is a host-to-device transfer "
        "of the same bytes, while Redis's read and the network stay as here."
    )
    return section
