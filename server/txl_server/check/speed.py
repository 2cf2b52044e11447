"""Speed, as `python -m txl_server check` measures it through a running worker: decoding one session and a batch,
and scoring a document, each against the memory-bandwidth floor measured in the same run (`check.floor`).

Decoding is measured where users run it: each session's memory full, at the served mem_len, so that a step reads
its keys and values as well as the weights, and the floor counts both (`bytes_per_token`): with a memory of a few
hundred positions a GPU step's time is the count of its kernels, not its bytes. The sessions of the batch have
memories of their own (one shared memory would be read from the cache)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import torch
from txl.sampling import SamplingParams

from ..engine.jobs import AdvanceJob, GenerateJob, job_result
from ..engine.state import ModelState
from ..engine.worker import Worker
from .floor import bytes_per_token, copy_bandwidth, weight_bytes


@dataclass(frozen=True)
class Speed:
    bandwidth: float  # bytes/s copied on the device, read + written
    weight_bytes: int  # read once per decoding step
    floor_one: (
        float  # seconds per step of one session, at least: its bytes (weights, keys, values) / bandwidth
    )
    decode_one: float  # seconds per token, one session
    batch: int
    decode_batch: float  # seconds per step, `batch` sessions
    document: int
    scoring: float  # tokens/s scoring one document
    scoring_floor: float  # tokens/s if each segment's forward read only the weights, at the bandwidth
    mem: int = 0  # positions of memory each decoding session holds (the served mem_len)
    floor_batch: float = (
        0.0  # seconds per step of `batch` sessions, at least (weights once, each row's memory)
    )


async def measure_speed(worker: Worker, mem_len: int) -> Speed:
    model = worker.model
    device = worker.pool.layout.device
    on_cpu = device.type == "cpu"
    bandwidth = await asyncio.to_thread(copy_bandwidth, device, 256 if on_cpu else 1024)
    weights = weight_bytes(model)
    batch = min(worker.max_batch_size, 16 if on_cpu else 64)
    states = await asyncio.gather(*(_full_memory(worker, mem_len, seed) for seed in range(batch)))
    per_row = bytes_per_token(model, mem_len) - weights
    floor_one = (weights + per_row) / bandwidth
    floor_batch = (weights + batch * per_row) / bandwidth
    steps = 64 if on_cpu else 256
    greedy = SamplingParams(temperature=0)

    def generation(state: ModelState, tokens: int) -> Awaitable[Any]:
        return _kept_nothing(job_result(worker, GenerateJob(state, [], tokens, greedy)))

    await generation(states[0], 8)  # warm-up
    one = await _seconds(lambda: generation(states[0], steps)) / steps
    per_step = await _seconds(lambda: asyncio.gather(*(generation(s, steps) for s in states))) / steps
    segments = 16 if on_cpu else 64
    document_length = segments * worker.segment_len
    document = _random_tokens(model.config.vocab_size, document_length, seed=0)
    await _kept_nothing(
        job_result(worker, AdvanceJob(worker.empty_state(mem_len), document[: worker.segment_len]))
    )
    scoring = document_length / await _seconds(
        lambda: _kept_nothing(
            job_result(worker, AdvanceJob(worker.empty_state(mem_len), document, token_logprobs=True))
        )
    )
    for state in states:
        state.release()
    return Speed(
        bandwidth,
        weights,
        floor_one,
        one,
        batch,
        per_step,
        document_length,
        scoring,
        document_length / (segments * weights / bandwidth),
        mem_len,
        floor_batch,
    )


async def _full_memory(worker: Worker, mem_len: int, seed: int) -> ModelState:
    """A session whose memory holds mem_len positions (of random tokens; the speed does not depend on them)."""
    tokens = _random_tokens(worker.model.config.vocab_size, mem_len + 1, seed=1 + seed)
    return (await job_result(worker, AdvanceJob(worker.empty_state(mem_len), tokens))).state


async def _kept_nothing(result: Awaitable[Any]) -> Any:
    """A job's result, its state released: a measurement keeps nothing in the pool."""
    outcome = await result
    outcome.state.release()
    return outcome


def _random_tokens(vocab: int, n: int, *, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def _seconds(run: Callable[[], Awaitable[Any]]) -> float:
    """Wall-clock seconds of `run()` to its end."""
    started = time.perf_counter()
    await run()
    return time.perf_counter() - started
