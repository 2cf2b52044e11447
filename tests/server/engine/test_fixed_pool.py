"""A memory pool that never grows (what a GPU gets): when it is full, the worker runs what fits, idle sessions
leave the device, and work is preempted: re-queued from its input and served unseen with the same tokens, or, when
only the waiting jobs' inputs fill the pool, the newest fails with a retryable error; no step fails otherwise,
results are those of a roomy pool, and the pool's tensors are never reallocated. Blocks are released by their
holders: once every session is gone, every block is free, whatever the requests did."""

from __future__ import annotations

import asyncio

import pytest
import torch
from txl.sampling import SamplingParams
from txl_server.engine import device_failure, preemption
from txl_server.engine import scheduler as scheduler_module
from txl_server.errors import Overloaded
from txl_server.runtime import Runtime
from txl_server.settings import Persistence

from tests.helpers.runtimes import OWNER, generate, leave_after, running

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
    requeued = []  # the jobs sent back to the queue, with the tokens their clients had then
    requeue = preemption.requeue

    def recorded(task, scheduler, outputs):
        requeued.append((task.job, task.job.tokens_sent))
        requeue(task, scheduler, outputs)

    monkeypatch.setattr(preemption, "requeue", recorded)
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
        baseline = pool.used_blocks, pool.live_tables  # the graphs' scratch block, if any
        metas = [await runtime.service.create(OWNER, text=p) for p in PROMPTS]
        got = await _generations(runtime.service, metas)
        assert pool.keys.data_ptr() == keys and pool.n_blocks == blocks and pool.generation == 0
        await _delete_all(runtime, metas)
        assert (pool.used_blocks, pool.live_tables) == baseline
    finished = [g for g in got if g is not None]
    assert len(finished) >= 2
    for tokens, want in zip(got, expected, strict=True):  # no token lost or sent twice by a re-queued job
        assert tokens is None or tokens == want
    # A job re-queued that finished had the tokens it would have had alone, none sent twice (above); one re-queued
    # and later failed never sent more than it had.
    assert all(job.tokens_sent <= 40 for job, _ in requeued)


@pytest.mark.parametrize("prompt", ["", " and a prompt fed first"])
async def test_a_requeued_job_runs_again_from_its_input_and_its_client_sees_the_same_tokens(runtime, prompt):
    """A generation preempted mid-way (its client has 6 tokens) goes back to the queue: its progress is released,
    it runs again from its input with the same seed, and the tokens its client had are not sent again: its
    client gets exactly what the same generation alone gets."""
    worker = runtime.worker
    baseline = worker.pool.used_blocks, worker.pool.live_tables
    meta = await runtime.service.create(OWNER, text="A session to generate from")
    twin = await runtime.service.fork(OWNER, meta.id)
    sampling = SamplingParams(temperature=0.9, seed=7)
    alone, _ = await generate(runtime.service, twin.id, text=prompt, max_tokens=20, sampling=sampling)
    decoded, requeued = worker.outputs.decoded, []

    def preempting(task, out):
        decoded(task, out)
        if not requeued and len(task.token_ids) == 6 and task in worker.scheduler.decoding:
            requeued.append(task.job.tokens_sent)
            preemption.requeue(task, worker.scheduler, worker.outputs)

    worker.outputs.decoded = preempting
    events, outcome = await generate(runtime.service, meta.id, text=prompt, max_tokens=20, sampling=sampling)
    assert requeued and requeued[0] > 0  # its client had tokens when it was preempted
    assert [(e.id, e.text) for e in events] == [(e.id, e.text) for e in alone]
    assert outcome.result.token_ids == [e.id for e in alone]
    await _delete_all(runtime, [meta, twin])
    assert (worker.pool.used_blocks, worker.pool.live_tables) == baseline


async def _delete_all(runtime, metas) -> None:
    for meta in metas:
        await runtime.service.delete(OWNER, meta.id)
    runtime.service.prefix_cache.clear()
    await runtime.worker.call(lambda: None)  # the iteration that ended the last job has returned


async def test_every_block_is_free_once_the_sessions_are_gone_whatever_the_requests_did(
    make_settings, monkeypatch
):
    """Sessions created, appended to, forked, rewound, exported and imported; generations finished, failed,
    and left by their client mid-stream; stateless scoring: with every session deleted and the prefix cache
    emptied, every block of the pool is free (nothing waits for a garbage collector)."""
    settings = make_settings(
        fixed_pool=True, device_memory_bytes=64 * 16 * 512, persistence=Persistence.ALWAYS
    )
    async with running(settings) as runtime:
        pool, service = runtime.worker.pool, runtime.service
        baseline = pool.used_blocks, pool.live_tables
        metas = [await service.create(OWNER, text=p) for p in PROMPTS[:3]]
        await service.append(OWNER, metas[0].id, "and then some more text.")
        metas.append(await service.fork(OWNER, metas[0].id))
        await generate(service, metas[1].id, max_tokens=5)
        metas.append(await service.fork(OWNER, metas[1].id, version=1))
        await service.history.rewind(OWNER, metas[1].id, 1)
        snapshot = await service.export_snapshot(OWNER, metas[2].id)
        metas.append(await service.import_snapshot(OWNER, snapshot))
        await leave_after(service.generate(OWNER, metas[2].id, max_tokens=30, sampling=SamplingParams()), 2)
        await runtime.stateless.score("a text to score, read through the prefix cache", owner=OWNER)

        def broken(decode, chunks, **kwargs):
            raise RuntimeError("this step fails")

        with monkeypatch.context() as patch:
            patch.setattr(runtime.worker.runner, "run", broken)
            with pytest.raises(RuntimeError):
                await generate(service, metas[3].id, max_tokens=3)
        assert pool.used_blocks > baseline[0]
        await _delete_all(runtime, metas)
        assert (pool.used_blocks, pool.live_tables) == baseline


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
