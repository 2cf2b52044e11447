"""The engine in process: aggregate decode throughput and latency with 1, 4, 16 and 64 concurrent sessions.

Each session has a 64-token prompt and samples 32 tokens (temperature 1, its own seed). Jobs go straight to the
device worker (no HTTP, no Redis), all submitted at once: time to first token includes the prompt's prefill
and waiting for the others'; inter-token latency is the gap between a session's consecutive tokens.
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
from txl_server.engine.jobs import DoneEvent, ErrorEvent, GenerateJob, TokenEvent
from txl_server.engine.state import ModelState
from txl_server.engine.worker import Worker
from txl_server.settings import BUNDLED_MODEL_DIR

from .common import Section, percentile
from .paper_table9 import wt103_model

PROMPT_TOKENS = 64
NEW_TOKENS = 32


class _WordIds:
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
    from txl.train import TrainConfig

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


async def measure(
    worker: Worker, model: txl.TransfoXLLMHeadModel, sessions: int, new_tokens: int
) -> RunStats:
    prompt = torch.randint(
        0, min(model.config.vocab_size, 256), (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    start_id = 10
    jobs = []
    for i in range(sessions):
        state = ModelState.empty(model.empty_memory())
        jobs.append(
            GenerateJob(state, [start_id, *prompt], new_tokens, SamplingParams(temperature=1.0, seed=i))
        )
    started = time.perf_counter()
    for job in jobs:
        worker.submit(job)

    async def collect(job: GenerateJob) -> list[float]:
        stamps = []
        async for event in job.events():
            if isinstance(event, TokenEvent):
                stamps.append(time.perf_counter())
            elif isinstance(event, ErrorEvent):
                raise event.error
            elif isinstance(event, DoneEvent):
                break
        return stamps

    all_stamps = await asyncio.gather(*(collect(job) for job in jobs))
    ended = max(s[-1] for s in all_stamps)
    first = [s[0] - started for s in all_stamps]
    gaps = [b - a for s in all_stamps for a, b in itertools.pairwise(s)]
    total = sum(len(s) for s in all_stamps)
    rates = [(len(s) - 1) / (s[-1] - s[0]) for s in all_stamps if len(s) > 1]
    return RunStats(sessions, total / (ended - started), percentile(first, 50), percentile(first, 99),
                    percentile(gaps, 50), percentile(gaps, 99), sum(rates) / max(len(rates), 1))  # fmt: skip


def run_model(
    model: txl.TransfoXLLMHeadModel, tokenizer: Tokenizer, counts: tuple[int, ...], new_tokens: int
) -> list[RunStats]:
    async def main() -> list[RunStats]:
        worker = Worker(
            model, tokenizer, segment_len=model.config.segment_len, max_batch_size=64, max_queued=4096
        )
        worker.start()
        try:
            await measure(worker, model, 1, 4)  # warm-up: positional tables, allocator
            return [await measure(worker, model, n, new_tokens) for n in counts]
        finally:
            worker.stop()

    return asyncio.run(main())


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
        ("wt103 shape (random weights)", big, _WordIds(), 8 if quick else 16),
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
