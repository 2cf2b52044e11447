"""One batched step: the engine against the model's own batched step, and bursts of prompts.

Decode: 64 sessions of the bundled model, each with a full memory (mem_len positions), generate at once through
the engine (worker thread, scheduler, sampling on the device, every row in one forward). The reference is the
model's own step with one memory of 64 rows at the same length (`model(tokens, memory)` then the next-token
distribution), chained: what a step costs with no engine around it. Both run with the server's thread policy.

Bursts: 16 prompts of 1,500 bytes each arrive at once, and the same 16 one after another; with chunked prefill
the burst's segments share forwards (up to `max_batch_tokens` tokens each).
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import time

import torch
import txl
from txl.paged import step as paged_step
from txl.sampling import SamplingParams
from txl_server.check.benchmark_docs import Section
from txl_server.engine.jobs import AdvanceJob, GenerateJob, job_result
from txl_server.engine.state import ModelState
from txl_server.engine.worker import Worker
from txl_server.memory_budgets import memory_budgets
from txl_server.runtime import default_batch_tokens, device_pool, worker_threads
from txl_server.settings import Settings

from .engine import bundled_model

SESSIONS = 64
BURST = 16
BURST_BYTES = 1500


def _random_memory(
    model: txl.TransfoXLLMHeadModel, rows: int, length: int, pool: txl.BlockPool
) -> txl.Memory:
    layout = model.memory_layout()
    generator = torch.Generator().manual_seed(rows)
    shape = (rows, layout.n_head, length, layout.d_head)
    tensors = {
        f"{kind}.{i}": torch.randn(shape, generator=generator, dtype=layout.dtype)
        for kind in ("keys", "values")
        for i in range(layout.n_layer)
    }
    return txl.Memory.from_tensors(layout, tensors, mem_len=length, pool=pool)


def model_step_rate(model: txl.TransfoXLLMHeadModel, length: int, steps: int) -> float:
    """Tokens/s of the model's own step over one memory of SESSIONS rows, chained."""
    memory = _random_memory(model, SESSIONS, length, txl.BlockPool(model.memory_layout()))
    tokens = torch.randint(0, model.config.vocab_size, (SESSIONS, 1))
    path = txl.fastest(model.device)  # the kernels the engine's path takes
    with torch.inference_mode():
        for _ in range(3):
            hidden, memory = model(tokens, memory, path=path)
        started = time.perf_counter()
        for _ in range(steps):
            hidden, memory = model(tokens, memory, path=path)
            tokens = model.log_probs(hidden[:, -1], path).argmax(-1, keepdim=True)
        return SESSIONS * steps / (time.perf_counter() - started)


async def engine_rate(worker: Worker, model: txl.TransfoXLLMHeadModel, length: int, steps: int) -> float:
    """Tokens/s of SESSIONS generations at once through the engine, from first token to last."""
    memory = await worker.call(lambda: _random_memory(model, SESSIONS, length, worker.pool))
    hidden = torch.randn(SESSIONS, model.config.d_model, generator=torch.Generator().manual_seed(3))
    states = [ModelState(memory.row(i), hidden[i], ()) for i in range(SESSIONS)]
    del memory
    jobs = [GenerateJob(s, [], steps, SamplingParams(temperature=1.0, seed=i)) for i, s in enumerate(states)]
    stamps: list[float] = []
    started = time.perf_counter()
    await asyncio.gather(
        *(job_result(worker, job, lambda _: stamps.append(time.perf_counter())) for job in jobs)
    )
    first = min(stamps) if stamps else started
    return (len(stamps) - SESSIONS) / (max(stamps) - first)  # from the first token: the decode phase only


async def burst(
    worker: Worker, model: txl.TransfoXLLMHeadModel, prompts: list[list[int]], together: bool
) -> float:
    def job(prompt: list[int]) -> AdvanceJob:
        return AdvanceJob(ModelState.empty(model.empty_memory(pool=worker.pool)), prompt)

    started = time.perf_counter()
    if together:
        await asyncio.gather(*(job_result(worker, job(p)) for p in prompts))
    else:
        for p in prompts:
            await job_result(worker, job(p))
    return time.perf_counter() - started


def segments_together(
    model: txl.TransfoXLLMHeadModel, rows: int, rounds: int
) -> list[tuple[float, float, float]]:
    """Seconds for `rows` prompt segments at a full memory: one forward each, one forward for all (split into
    cache-sized parts, as the engine runs it), and one forward for all unsplit. Interleaved rounds."""
    pool = txl.BlockPool(model.memory_layout())
    segment, length = model.config.segment_len, model.config.mem_len
    memory = _random_memory(model, rows, length, pool)
    tables = [memory.rows[i] for i in range(rows)]
    mem_lens = [length] * rows
    tokens = torch.randint(0, model.config.vocab_size, (rows * segment,))
    path = txl.fastest(model.device)
    forward = functools.partial(model.transformer.forward_rows, path=path)
    results = []
    with torch.inference_mode():
        for _ in range(rounds):
            started = time.perf_counter()
            for i, row in enumerate(tables):
                forward(tokens[i * segment : (i + 1) * segment], [segment], [row], [length], pool)
            alone = time.perf_counter() - started
            timed = []
            for score_bytes in (paged_step.CPU_SCORE_BYTES, 1 << 60):
                saved, paged_step.CPU_SCORE_BYTES = paged_step.CPU_SCORE_BYTES, score_bytes
                try:
                    started = time.perf_counter()
                    forward(tokens, [segment] * rows, tables, mem_lens, pool)
                    timed.append(time.perf_counter() - started)
                finally:
                    paged_step.CPU_SCORE_BYTES = saved
            results.append((alone, timed[0], timed[1]))
    return results


def run(quick: bool = False) -> Section:
    threads = worker_threads(Settings())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # before the section: its machine line names the threads
    section = Section(
        "batching", "One batched step: the engine against the model's own step", "python -m bench batching"
    )
    section.note(__doc__.split("\n\n", 1)[1].strip())
    model, tokenizer, label = bundled_model()
    length, steps = model.config.mem_len, 8 if quick else 32
    segment = model.config.segment_len
    text = b"It was the best of times, it was the worst of times, it was the age of wisdom. " * 30
    prompts = [[10, *text[i : i + BURST_BYTES]] for i in range(BURST)]
    budgets = [default_batch_tokens(torch.device("cpu"), segment), 4 * segment]

    async def measure() -> tuple[list[tuple[float, float]], list[tuple[int, float, float]]]:
        rates, bursts = [], []
        for budget in budgets:
            worker = Worker(
                model,
                tokenizer,
                segment_len=segment,
                max_batch_size=SESSIONS,
                max_batch_tokens=budget,
                max_queued=4096,
                # Sized up front to the device budget, as the server's is: no round pays for the pool growing
                # (a growable pool copies itself when it does).
                pool=device_pool(
                    model, Settings(), memory_budgets(Settings(), model), max_batch_tokens=budget
                ),
                path=txl.fastest(model.device),  # as a server's start-up chooses where its checks pass
            )
            worker.start()
            try:
                if budget == budgets[0]:
                    for _ in range(2 if quick else 3):  # interleaved: a slow spell hits both sides
                        ours = await engine_rate(worker, model, length, steps)
                        theirs = model_step_rate(model, length, steps)
                        rates.append((ours, theirs))
                await burst(worker, model, prompts[:2], True)  # warm-up
                apart = await burst(worker, model, prompts, False)
                together = await burst(worker, model, prompts, True)
                bursts.append((budget, apart, together))
            finally:
                worker.stop()
        return rates, bursts

    try:
        rates, bursts = asyncio.run(measure())
        parts = segments_together(model, 4, 3 if quick else 7)
    finally:
        torch.set_num_threads(before)
    best = max(rates, key=lambda r: r[0] / r[1])
    section.table(
        f"{label}: {SESSIONS} sessions decoding at mem_len {length}, tokens/s ({threads} torch thread(s))",
        ["round", "engine", "model's own batched step", "engine / model"],
        [[i + 1, ours, theirs, ours / theirs] for i, (ours, theirs) in enumerate(rates)],
    )
    section.note(
        f"Best round: the engine at {best[0] / best[1]:.2f}x the model's own step (target: at least 0.9x; before "
        "this engine, with a memory per session and attention per session, it was about 0.55x)."
    )
    section.table(
        f"{label}: {BURST} prompts of {BURST_BYTES:,} bytes, seconds until all are ingested",
        ["max_batch_tokens", "one after another", "all at once", "at once / one after another"],
        [[budget, apart, together, together / apart] for budget, apart, together in bursts],
    )
    section.note("Target: the burst takes at most half the time of the same prompts one after another.")
    alone, tiled, whole = (statistics.median(column) for column in zip(*parts, strict=True))
    section.table(
        f"{label}: 4 prompt segments of {segment} tokens at mem_len {length}, seconds (median of "
        f"{len(parts)} interleaved rounds)",
        [
            "one forward each",
            "one forward, scores in cache-sized parts",
            "one forward, unsplit",
            "parts / each",
            "unsplit / each",
        ],
        [[alone, tiled, whole, tiled / alone, whole / alone]],
    )
    section.note(
        "On a CPU a group of prompt segments runs its attention in parts whose scores fit in "
        f"{paged_step.CPU_SCORE_BYTES >> 20} MiB (`txl.paged.step.CPU_SCORE_BYTES`): unsplit, the scores of several "
        "segments outgrow the cache and each pass over them (write, mask, softmax, read) runs at memory speed. "
        "The difference is largest in a process whose heap is still cold (fresh score tensors fault their pages "
        "in); here the measurement follows the engine rounds above, whose heap is warm."
    )
    return section
