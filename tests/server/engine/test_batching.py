"""One forward for many sessions: prompts of several sessions share forwards (chunked prefill under a token
budget), results equal running each alone, memory blocks are counted exactly, and Redis receives only the
blocks a commit changed."""

from __future__ import annotations

import asyncio

import pytest
from safetensors.torch import load, save
from txl.sampling import SamplingParams
from txl_server.engine.state import snapshot_metadata
from txl_server.engine.worker import WorkerObserver
from txl_server.sessions.store.blocks import BlockIndex, snapshot
from txl_server.settings import Persistence

from tests.helpers.runtimes import running

OWNER = "tenant-b"
TEXTS = [
    f"Session {i} begins: " + "the rain in Spain falls mainly on the plain. " * (2 + i) for i in range(6)
]


class Iterations(WorkerObserver):
    """What each forward held: (decoding rows, prompt tokens)."""

    def __init__(self) -> None:
        self.steps: list[list[int]] = []
        self._decode = 0

    def on_decode(self, batch_size: int, seconds: float) -> None:
        self._decode = batch_size
        self.steps.append([batch_size, 0])

    def on_prefill(self, tokens: int, seconds: float) -> None:
        if self._decode and self.steps and self.steps[-1][1] == 0:
            self.steps[-1][1] = tokens  # the same forward as the decode rows just reported
        else:
            self.steps.append([0, tokens])
        self._decode = 0


async def _next_tokens(service, session_id, n=8):
    tokens = []
    async for event in service.generate(
        OWNER, session_id, max_tokens=n, sampling=SamplingParams(temperature=0)
    ):
        if hasattr(event, "id"):
            tokens.append((event.id, event.logprob))
    return tokens


def assert_same_tokens(got, expected):
    """The same tokens, log-probabilities within 1e-5: a row's kernels may differ with the batch it runs in
    (linear kernels are chosen per row count), so the last bits may, and rounding would make equality flaky."""
    assert [token for token, _ in got] == [token for token, _ in expected]
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, expected, strict=True)) <= 1e-5


async def test_prompts_of_several_sessions_share_forwards_and_equal_running_alone(make_settings):
    async with running(make_settings(max_batch_tokens=40)) as rt:  # five segments of 8 per forward
        service = rt.service
        observed = Iterations()
        rt.worker.observer = observed
        together = await asyncio.gather(*(service.create(OWNER, text=t) for t in TEXTS))
        shared = [tokens for _, tokens in observed.steps if tokens > rt.worker.segment_len]
        assert shared, "no forward held segments of several sessions"
        assert max(tokens for _, tokens in observed.steps) <= 40
        alone = [await service.create(OWNER, text=t) for t in TEXTS]
        for a, b in zip(together, alone, strict=True):
            assert_same_tokens(await _next_tokens(service, a.id), await _next_tokens(service, b.id))


async def test_decoding_rows_run_in_every_forward_while_long_prompts_are_fed(make_settings):
    async with running(make_settings(max_batch_tokens=20)) as rt:
        service = rt.service
        talker = await service.create(OWNER, text="Once upon a time")
        readers = [await service.create(OWNER, text="x") for _ in range(3)]
        observed = Iterations()
        rt.worker.observer = observed
        # The appends start first and the stream joins once their prompts are in a forward: the other way
        # round, a fast machine could finish the stream before the appends had tokenised their text.
        appends = [
            asyncio.create_task(service.append(OWNER, r.id, "All work and no play. " * 20)) for r in readers
        ]
        async with asyncio.timeout(60):
            while not observed.steps:
                await asyncio.sleep(0.001)
        stream = asyncio.create_task(_next_tokens(service, talker.id, n=40))
        await asyncio.gather(stream, *appends)
        first = next(i for i, (d, _) in enumerate(observed.steps) if d)
        last = max(i for i, (d, _) in enumerate(observed.steps) if d)
        during = observed.steps[first : last + 1]
        # Until the stream ended, no forward left its row out, and prompts took the rest of the budget.
        assert all(d == 1 for d, _ in during) and len(during) >= 40
        assert max(t for _, t in during) <= 19 and sum(t for _, t in during) > 300


async def test_no_block_leaks_after_a_thousand_sessions_come_and_go(make_settings):
    # Blocks in the process are the point here, not Redis: "evict" writes nothing while the sessions fit.
    async with running(make_settings(max_sessions_per_tenant=2000, persistence="evict")) as rt:
        service, pool = rt.service, rt.worker.pool
        baseline = pool.used_blocks
        live = []
        for i in range(1000):
            meta = await service.create(OWNER, text="abc" * (i % 17))
            live.append(meta.id)
            if i % 10 == 0:
                live.append((await service.fork(OWNER, meta.id)).id)
            if i % 7 == 0:
                await service.append(OWNER, meta.id, "more text " * (i % 5))
            if len(live) > 30:
                for session_id in live[:20]:
                    await service.delete(OWNER, session_id)
                live = live[20:]
            # The pool holds exactly the blocks of the cached sessions and prefixes: no block is held by nothing.
            # (A call through the worker first: the iteration that finished a job may still be returning.)
            if i % 97 == 0:
                await rt.worker.call(lambda: None)
                states = [
                    s for e in service.cache._entries.values() for s in e.states()
                ]  # older versions too
                states += service.prefix_cache.states()
                held = {b for state in states for b in state.memory.block_ids().tolist()}
                del states
                assert pool.used_blocks - baseline == len(held)
                assert service.prefix_cache.used <= service.prefix_cache.budget
        for session_id in live:
            await service.delete(OWNER, session_id)
        service.prefix_cache.clear()
        await rt.worker.call(lambda: None)
        assert pool.used_blocks == baseline


async def test_a_small_append_sends_redis_only_the_blocks_it_changed(make_settings, redis_server):
    async with running(
        make_settings(persistence=Persistence.ALWAYS, max_mem_len=512, default_mem_len=512)
    ) as rt:
        service = rt.service
        meta = await service.create(OWNER, text="It was the best of times, it was the worst of times. " * 12)
        state = service.cache.peek(meta.id).state
        whole = snapshot(state, BlockIndex()).nbytes
        block = state.memory.pool.block_nbytes
        redis = service.store.redis
        before = (await redis.info("stats"))["total_net_input_bytes"]
        outcome = await service.append(OWNER, meta.id, "Yes.")
        sent = (await redis.info("stats"))["total_net_input_bytes"] - before
        assert sent < 2 * block + 8192 and sent < whole / 8, (sent, block, whole)
        # What Redis holds is the whole memory: a server that never saw the session continues it exactly.
        expected = await _next_tokens(service, (await service.fork(OWNER, meta.id)).id)
        async with running(
            make_settings(
                persistence=Persistence.ALWAYS,
                max_mem_len=512,
                default_mem_len=512,
                redis_prefix=service.store.prefix,
            )
        ) as other:
            assert outcome.session.version == 2
            fork = await other.service.fork(OWNER, meta.id)  # read from Redis: the other server never held it
            assert await _next_tokens(other.service, fork.id) == expected

    async with running(make_settings(persistence=Persistence.ALWAYS)) as rt:
        service = rt.service
        meta = await service.create(OWNER, text="An old memory.")
        state = service.cache.peek(meta.id).state
        expected = await _next_tokens(service, (await service.fork(OWNER, meta.id)).id)
        key = f"{service.store.prefix}m:{meta.id}"
        await service.store.redis.delete(key)
        await service.store.redis.hset(key, mapping={"version": str(meta.version), "data": state.to_bytes()})
        service.cache.drop(meta.id)
        assert await _next_tokens(service, meta.id) == expected


@pytest.mark.parametrize("with_fed", [True, False])
async def test_an_export_imports_into_a_continuing_session(runtime, with_fed):
    """Exports keep their safetensors format; one made before positions were counted (no `fed`) imports too."""
    service = runtime.service
    meta = await service.create(OWNER, text="Exported text that continues.")
    data = await service.export_snapshot(OWNER, meta.id)
    if not with_fed:
        header = snapshot_metadata(data)
        del header["fed"]
        data = save(load(data), metadata=header)
    imported = await service.import_snapshot(OWNER, data)
    assert await _next_tokens(service, imported.id) == await _next_tokens(
        service, (await service.fork(OWNER, meta.id)).id
    )
