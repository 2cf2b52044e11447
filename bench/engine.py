"""The engine in process: aggregate decode throughput and latency with 1, 4, 16 and 64 concurrent sessions.

Decode: each session's 64-token prompt is ingested first; then all sessions sample their tokens at once
(temperature 1, each its own seed) and the worker batches them into one forward per step. Tokens/s is the
aggregate over that phase; inter-token latency (ITL) is the gap between a session's consecutive tokens. Time to
first token (TTFT): the same number of sessions arriving together with their prompts (ingested one segment per
iteration, round robin). Jobs go straight to the device worker: no HTTP, no Redis.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

import torch
import txl
from txl.sampling import SamplingParams
from txl.tokenizers import ByteTokenizer, Tokenizer, load_tokenizer
from txl_server.check.benchmark_docs import Section
from txl_server.engine.jobs import AdvanceJob, DoneEvent, ErrorEvent, GenerateJob, TokenEvent
from txl_server.engine.state import ModelState
from txl_server.engine.worker import Worker
from txl_server.runtime import worker_threads
from txl_server.settings import BUNDLED_MODEL_DIR, Settings

from .common import percentile
from .paper_table9 import wt103_model

PROMPT_TOKENS = 64
NEW_TOKENS = 64


class WordIds:
    """Stand-in tokenizer for the random wt103-shape model: ids in, `<id>` text out."""

    vocab_size = 267735
    eos_id = 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 1000 for c in text]

    def decode(self, ids):
        return " ".join(map(str, ids))

    def decoder(self, previous=()):
        return _Pieces()

    def token_text(self, token_id: int) -> str:
        return str(token_id)

    def to_json(self) -> dict:
        return {}


class _Pieces:
    has_pending = False

    def push(self, token_id: int) -> str:
        return f" {token_id}"

    def flush(self) -> str:
        return ""


def bundled_model() -> tuple[txl.TransfoXLLMHeadModel, Tokenizer, str]:
    if (BUNDLED_MODEL_DIR / "config.json").is_file():
        return txl.load_pretrained(BUNDLED_MODEL_DIR), load_tokenizer(BUNDLED_MODEL_DIR), "bundled byte model"
    from txl.training.train import TrainConfig

    model = txl.TransfoXLLMHeadModel(TrainConfig().model_config())
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval(), ByteTokenizer(), "bundled shape (random weights: model not bundled yet)"


@dataclass
class RunStats:
    sessions: int
    tokens_per_s: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    stream_rate: float  # a session's tokens/s between its first and last token (mean over sessions)


async def _collect(job: GenerateJob) -> list[float]:
    stamps = []
    async for event in job.events():
        if isinstance(event, TokenEvent):
            stamps.append(time.perf_counter())
        elif isinstance(event, ErrorEvent):
            raise event.error
        elif isinstance(event, DoneEvent):
            event.result.state.release()  # its blocks go back to the pool
            break
    return stamps


async def measure(
    worker: Worker, model: txl.TransfoXLLMHeadModel, sessions: int, new_tokens: int
) -> RunStats:
    """Decode: sessions with their prompts already ingested all generate at once (tokens/s, ITL). Time to first
    token: the same number of sessions arriving together with their prompts."""
    generator = torch.Generator().manual_seed(1)
    prompts = [
        [10, *torch.randint(32, 127, (PROMPT_TOKENS,), generator=generator).tolist()] for _ in range(sessions)
    ]
    states = []
    for prompt in prompts:
        job = AdvanceJob(ModelState.empty(model.empty_memory()), prompt)
        worker.submit(job)
        result = await job.result()
        states.append(result.state)
    jobs = [
        GenerateJob(s, [], new_tokens, SamplingParams(temperature=1.0, seed=i)) for i, s in enumerate(states)
    ]
    started = time.perf_counter()
    for job in jobs:
        worker.submit(job)
    for state in states:  # each job holds its own
        state.release()
    stamps = await asyncio.gather(*(_collect(job) for job in jobs))
    ended = max(s[-1] for s in stamps)
    gaps = [b - a for s in stamps for a, b in itertools.pairwise(s)]
    total = sum(len(s) for s in stamps)
    rates = [(len(s) - 1) / (s[-1] - s[0]) for s in stamps if len(s) > 1]
    # Time to first token: prompts and sessions arriving together.
    arrivals = [
        GenerateJob(ModelState.empty(model.empty_memory()), p, 2, SamplingParams(seed=i))
        for i, p in enumerate(prompts)
    ]
    arrived = time.perf_counter()
    for job in arrivals:
        worker.submit(job)
    first = [s[0] - arrived for s in await asyncio.gather(*(_collect(job) for job in arrivals))]
    return RunStats(sessions, total / (ended - started), percentile(first, 50), percentile(first, 99),
                    percentile(gaps, 50), percentile(gaps, 99), sum(rates) / max(len(rates), 1))  # fmt: skip


def run_model(
    model: txl.TransfoXLLMHeadModel, tokenizer: Tokenizer, counts: tuple[int, ...], new_tokens: int
) -> list[RunStats]:
    """Runs a worker with the server's thread policy (on CPU: all cores but one, left to the event loop)."""

    async def main() -> list[RunStats]:
        worker = Worker(
            model,
            tokenizer,
            segment_len=model.config.segment_len,
            max_batch_size=64,
            max_queued=4096,
            path=txl.fastest(model.device),  # as a server's start-up chooses where its checks pass
        )
        worker.start()
        try:
            await measure(worker, model, 1, 4)  # warm-up: positional tables, allocator
            results = []
            for n in counts:
                # This machine's timings jitter: three runs, the one with the median throughput.
                runs = sorted(
                    [await measure(worker, model, n, new_tokens) for _ in range(3)],
                    key=lambda r: r.tokens_per_s,
                )
                results.append(runs[1])
            return results
        finally:
            worker.stop()

    before = torch.get_num_threads()
    torch.set_num_threads(worker_threads(Settings()))
    try:
        return asyncio.run(main())
    finally:
        torch.set_num_threads(before)


def run(quick: bool = False) -> Section:
    section = Section(
        "engine", "Engine throughput and latency in process (continuous batching)", "python -m bench engine"
    )
    section.note(__doc__.split("\n\n", 1)[1].strip())
    counts = (1, 4, 16) if quick else (1, 4, 16, 64)
    small, tokenizer, label = bundled_model()
    big = wt103_model()
    for name, model, tok, new_tokens in (
        (label, small, tokenizer, NEW_TOKENS),
        ("wt103 shape (random weights)", big, WordIds(), 8 if quick else 16),
    ):
        stats = run_model(model, tok, counts, new_tokens)
        base = stats[0].tokens_per_s
        section.table(
            f"{name}, float32: aggregate decode tokens/s and latency (ms)",
            ["sessions", "tokens/s", "x one session", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99"],
            [[s.sessions, s.tokens_per_s, s.tokens_per_s / base, s.ttft_p50 * 1000, s.ttft_p99 * 1000,
              s.itl_p50 * 1000, s.itl_p99 * 1000] for s in stats],
        )  # fmt: skip
        layout = model.memory_layout()
        per_session = model.config.mem_len * layout.bytes_per_position()
        budget = 8 * 2**30
        section.note(
            f"{name}: memory per session at mem_len {model.config.mem_len} = {per_session / 2**20:.1f} MiB "
            f"(float32), so {budget // per_session:,} full sessions fit an 8 GiB budget."
        )
    section.note("Target: 16 sessions give at least 4x the tokens/s of one session.")
    return section
