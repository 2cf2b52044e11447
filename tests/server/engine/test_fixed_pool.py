"""A memory pool that never grows (what a GPU gets): when it is full, the worker runs what fits, idle sessions
leave the device, and the newest work is preempted with a retryable error; no step fails otherwise, results are
those of a roomy pool, and the pool's tensors are never reallocated."""

from __future__ import annotations

import asyncio

import pytest
import torch
from txl.sampling import SamplingParams
from txl_server.engine import device_failure
from txl_server.engine import scheduler as scheduler_module
from txl_server.errors import Overloaded
from txl_server.runtime import Runtime
from txl_server.settings import Persistence

from tests.helpers.runtimes import OWNER, generate, running

PROMPTS = [f"Session {i} begins with a line of its own, number {i}." for i in range(6)]


async def _generations(service, metas):
    async def one(meta):
        try:
            events, _ = await generate(
                service, meta.id, max_tokens=40, sampling=SamplingParams(temperature=0)
            )
        except Overloaded:
            return None
        return [e.id for e in events]

    return await asyncio.gather(*(one(m) for m in metas))


async def test_a_full_fixed_pool_preempts_instead_of_growing(make_settings, monkeypatch):
    monkeypatch.setattr(scheduler_module, "PREEMPT_AFTER_SECONDS", 0.3)
    async with running(make_settings()) as roomy:
        metas = [await roomy.service.create(OWNER, text=p) for p in PROMPTS]
        expected = await _generations(roomy.service, metas)
    # About 8 blocks of 16 positions for sessions at rest and a few for one iteration: six sessions decoding at
    # once need more than the pool holds.
    tight = make_settings(
        fixed_pool=True,
        device_memory_bytes=8 * 16 * 512,
        max_batch_size=2,
        max_batch_tokens=16,
        persistence=Persistence.ALWAYS,
    )
    async with running(tight) as runtime:
        pool = runtime.worker.pool
        keys, blocks = pool.keys.data_ptr(), pool.n_blocks
        assert not pool.growable
        metas = [await runtime.service.create(OWNER, text=p) for p in PROMPTS]
        got = await _generations(runtime.service, metas)
        assert pool.keys.data_ptr() == keys and pool.n_blocks == blocks and pool.generation == 0
    finished = [g for g in got if g is not None]
    assert len(finished) >= 2
    for tokens, want in zip(got, expected, strict=True):
        assert tokens is None or tokens == want


async def test_a_device_error_makes_the_server_not_ready(runtime, monkeypatch):
    """A CUDA error poisons the device's context for good: the step's requests fail, and /ready turns red so that
    an orchestrator restarts the process (simulated: the runner raises what torch raises for one)."""
    meta = await runtime.service.create(OWNER, text="hello")
    assert await runtime.ready()

    def broken(decode, chunks, **kwargs):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(runtime.worker.runner, "run", broken)
    monkeypatch.setattr(device_failure, "device_works", lambda device: False)  # runs nothing more
    with pytest.raises(torch.AcceleratorError):
        await generate(runtime.service, meta.id, max_tokens=3)
    assert runtime.worker.device_error.startswith("CUDA error") and not await runtime.ready()


def test_block_sizes_the_gpu_kernel_cannot_walk_are_refused(make_settings):
    with pytest.raises(ValueError, match="power of two"):
        make_settings(block_size=12)
    assert make_settings(block_size=32).block_size == 32


async def test_by_default_only_a_cuda_pool_is_fixed(make_settings):
    runtime = Runtime(make_settings())
    await runtime.start()
    try:
        assert runtime.worker.pool.growable
    finally:
        await runtime.stop()
