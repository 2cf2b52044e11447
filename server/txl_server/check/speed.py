"""Speed, as `python -m txl_server check` measures it through a running worker: decoding one session and a batch,
and scoring a document, each against the memory-bandwidth floor measured in the same run (`check.floor`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import torch
from txl.sampling import SamplingParams

from ..engine.jobs import AdvanceJob, GenerateJob, job_result
from ..engine.worker import Worker
from .floor import copy_bandwidth, weight_bytes
from .parity import prompt_tokens


@dataclass(frozen=True)
class Speed:
    bandwidth: float  # bytes/s copied on the device, read + written
    weight_bytes: int  # read once per decoding step
    floor_one: float  # seconds per step, at least: the weights over the bandwidth
    decode_one: float  # seconds per token, one session
    batch: int
    decode_batch: float  # seconds per step, `batch` sessions
    document: int
    scoring: float  # tokens/s scoring one document
    scoring_floor: float  # tokens/s if each segment's forward read only the weights, at the bandwidth


async def measure_speed(worker: Worker, mem_len: int) -> Speed:
    model = worker.model
    device = worker.pool.layout.device
    on_cpu = device.type == "cpu"
    bandwidth = await asyncio.to_thread(copy_bandwidth, device, 256 if on_cpu else 1024)
    weights = weight_bytes(model)
    floor = weights / bandwidth
    prompt = prompt_tokens(worker, 300)
    started_state = (await job_result(worker, AdvanceJob(worker.empty_state(mem_len), prompt))).state
    steps = 64 if on_cpu else 256
    greedy = SamplingParams(temperature=0)

    def generation(tokens: int) -> Awaitable[Any]:
        return job_result(worker, GenerateJob(started_state, [], tokens, greedy))

    await generation(8)  # warm-up
    one = await _seconds(lambda: generation(steps)) / steps
    batch = min(worker.max_batch_size, 16 if on_cpu else 64)
    per_step = await _seconds(lambda: asyncio.gather(*(generation(steps) for _ in range(batch)))) / steps
    segments = 16 if on_cpu else 64
    document_length = segments * worker.segment_len
    document = torch.randint(
        0, model.config.vocab_size, (document_length,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    await job_result(worker, AdvanceJob(worker.empty_state(mem_len), document[: worker.segment_len]))
    scoring = document_length / await _seconds(
        lambda: job_result(worker, AdvanceJob(worker.empty_state(mem_len), document, token_logprobs=True))
    )
    return Speed(
        bandwidth,
        weights,
        floor,
        one,
        batch,
        per_step,
        document_length,
        scoring,
        document_length / (segments * floor),
    )


async def _seconds(run: Callable[[], Awaitable[Any]]) -> float:
    """Wall-clock seconds of `run()` to its end."""
    started = time.perf_counter()
    await run()
    return time.perf_counter() - started
