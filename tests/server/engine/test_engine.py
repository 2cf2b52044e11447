"""The session engine in process: worker, sessions, tiers, Redis metadata (a real Redis server)."""

from __future__ import annotations

import asyncio
import contextlib
import math

import pytest
import torch
import txl
from txl.paged.rows import resting_blocks
from txl.sampling import SamplingParams
from txl.scoring import score_tokens
from txl_server.engine.worker import WorkerObserver
from txl_server.errors import Conflict, Gone, InvalidRequest, NotFound
from txl_server.runtime import Runtime
from txl_server.sessions import outcomes as outcomes_module
from txl_server.sessions.service import new_session_id
from txl_server.sessions.state_cache import DEVICE, HOST
from txl_server.settings import Persistence

from tests.helpers.runtimes import OWNER, generate, leave_after, running


async def check_cache_matches_redis(service, session_id):
    meta = await service.store.get(session_id)
    entry = service.cache.peek(session_id)
    assert meta is not None
    if entry is not None:
        assert entry.version == meta.version
        assert entry.state.memory.length == meta.mem_tokens
        assert entry.tier == meta.tier
    return meta


async def test_append_logprob_is_the_models_log_probability(runtime):
    service = runtime.service
    meta = await service.create(OWNER, text="Hello, ")
    assert (meta.tokens, meta.version, meta.mem_tokens) == (7, 1, 8)  # 7 bytes + the start token
    outcome = await service.append(OWNER, meta.id, "world!")
    assert outcome.tokens == 6 and outcome.session.version == 2 and outcome.session.tokens == 13
    # The same text scored directly with the model library.
    model = service.model
    ids = [service.start_id, *b"Hello, world!"]
    direct = score_tokens(model, ids, mem_len=meta.mem_len, segment_len=8, token_logprobs=True)
    assert outcome.logprob == pytest.approx(sum(direct.token_logprobs[-6:]), abs=1e-4)
    await check_cache_matches_redis(service, meta.id)


async def test_a_session_at_rest_holds_only_the_blocks_of_its_window_and_continues_exactly(runtime):
    """A long text is ingested segment by segment; the session at rest holds just the blocks of the positions
    its next query's window reaches (its last mem_len, and those of its grid segment so far), and it continues
    exactly as the same text fed to the model directly."""
    service = runtime.service
    text = (
        "The quick brown fox jumps over the lazy dog. " * 6
    )  # 270 bytes: many 8-token segments, past mem_len 32
    meta = await service.create(OWNER, text=text)
    state = service.cache.peek(meta.id).state
    pool = state.memory.pool
    grid = runtime.worker.grid
    assert state.memory.length == meta.mem_len + (len(text) + 1) % grid
    assert (
        state.memory.allocated_nbytes
        <= resting_blocks(state.memory.length, pool.block_size) * pool.block_nbytes
    )
    # The same text fed to the model directly, on the server's decode path: the next tokens' log-probabilities
    # agree exactly.
    model, path = service.model, runtime.worker.runner.path
    ids = [service.start_id, *text.encode()]
    with torch.inference_mode():
        memory = model.empty_memory(1, mem_len=meta.mem_len, grid=grid)
        for start in range(0, len(ids), service.segment_len):
            segment = torch.tensor([ids[start : start + service.segment_len]])
            hidden, memory = model(segment, memory, path=path)
    torch.testing.assert_close(state.memory.keys(0), memory.keys(0), rtol=0, atol=0)
    torch.testing.assert_close(state.last_hidden, hidden[0, -1], rtol=0, atol=0)
    # An append continues from the session's memory as from the directly fed one, segment by segment.
    appended = list(b"More text.")
    expected = 0.0
    with torch.inference_mode():
        predictor = hidden[:, -1:]
        for start in range(0, len(appended), service.segment_len):
            chunk = appended[start : start + service.segment_len]
            log_probs = model.log_probs(predictor, path)
            expected += float(log_probs[0, 0, chunk[0]])
            hidden, memory = model(torch.tensor([chunk]), memory, path=path)
            if len(chunk) > 1:
                inner = model.log_probs(hidden[:, :-1], path)[0]
                expected += float(inner.gather(1, torch.tensor(chunk[1:])[:, None]).sum())
            predictor = hidden[:, -1:]
    outcome = await service.append(OWNER, meta.id, "More text.")
    assert outcome.logprob == pytest.approx(expected, abs=1e-4)


async def test_streamed_text_joins_to_the_result_and_generated_tokens_join_the_session(runtime):
    service = runtime.service
    meta = await service.create(OWNER, text="The sea ")
    tokens, outcome = await generate(service, meta.id, text="was ", max_tokens=10)
    assert len(tokens) == 10 and outcome.result.finish_reason == "length"
    assert "".join(t.text for t in tokens) == outcome.result.text
    assert outcome.session.tokens == meta.tokens + 4 + 10
    assert outcome.session.version == meta.version + 1
    await check_cache_matches_redis(service, meta.id)


async def test_stop_strings_end_generation_and_are_not_in_the_text(runtime):
    service = runtime.service
    meta = await service.create(OWNER, text="abc")
    fork = await service.fork(OWNER, meta.id)
    _, free = await generate(service, meta.id, max_tokens=20)
    text = free.result.text
    assert len(text) >= 4
    stop = text[2:4]  # two characters spanning what were separate tokens
    tokens, stopped = await generate(service, fork.id, max_tokens=20, stop=[stop])
    assert stopped.result.finish_reason == "stop"
    assert stopped.result.text == text[: text.find(stop)]
    assert "".join(t.text for t in tokens) == stopped.result.text


async def test_batched_generation_equals_sequential_for_the_same_seeds(runtime):
    service = runtime.service
    prompts = ["a", "the quick", "To be or not", "1234567890abcdefghijklmnop"]
    seeds = [1, 2, 3, 4]

    async def run_all(concurrently: bool):
        sessions = [await service.create(OWNER, text=p) for p in prompts]
        calls = [
            generate(
                service, s.id, max_tokens=16, sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
            )
            for s, seed in zip(sessions, seeds, strict=True)
        ]
        if concurrently:
            return await asyncio.gather(*calls)
        return [await call for call in calls]

    batch_sizes = []
    runtime.worker.observer = Recorder(batch_sizes)
    together = await run_all(True)
    alone = await run_all(False)
    assert max(size for kind, size in batch_sizes if kind == "decode") >= 2  # really batched
    for (tokens_a, out_a), (tokens_b, out_b) in zip(together, alone, strict=True):
        assert [t.id for t in tokens_a] == [t.id for t in tokens_b]
        assert out_a.result.text == out_b.result.text
        assert [t.logprob for t in tokens_a] == pytest.approx([t.logprob for t in tokens_b], abs=1e-4)


class Recorder(WorkerObserver):
    def __init__(self, log):
        self.log = log

    def on_prefill(self, tokens, seconds):
        self.log.append(("prefill", tokens))

    def on_decode(self, batch_size, seconds):
        self.log.append(("decode", batch_size))


async def test_a_long_append_delays_other_streams_by_at_most_one_segment(runtime):
    service = runtime.service
    talker = await service.create(OWNER, text="Once upon a time")
    reader = await service.create(OWNER, text="x")
    log = []
    runtime.worker.observer = Recorder(log)
    long_text = "All work and no play makes Jack a dull boy. " * 40  # 1,760 tokens = 220 segments of 8

    # The append starts first and the stream joins once its first chunk ran: with the stream first, a fast
    # machine could finish the 30 tokens before the append had tokenised its text.
    append = asyncio.create_task(service.append(OWNER, reader.id, long_text))
    async with asyncio.timeout(60):
        while not any(kind == "prefill" for kind, _ in log):
            await asyncio.sleep(0.001)
    gen = asyncio.create_task(generate(service, talker.id, max_tokens=30))
    await asyncio.gather(gen, append)
    # While both ran, decode steps alternated with single ingestion chunks: never two chunks in a row
    # between decode steps.
    decode_positions = [i for i, (kind, _) in enumerate(log) if kind == "decode"]
    first, last = decode_positions[0], decode_positions[-1]
    window = log[first : last + 1]
    runs, current = [], 0
    for kind, _ in window:
        if kind == "prefill":
            current += 1
        else:
            runs.append(current)
            current = 0
    assert max(runs) <= 1
    assert sum(1 for kind, _ in window if kind == "prefill") >= 20  # the append really ran alongside


async def test_cancelled_generation_leaves_the_session_unchanged(runtime):
    service = runtime.service
    meta = await service.create(OWNER, text="Call me Ishmael.")
    stream = service.generate(
        OWNER, meta.id, text=" Some", max_tokens=200, sampling=SamplingParams(temperature=0)
    )
    await leave_after(stream, 3)
    after = await check_cache_matches_redis(service, meta.id)
    assert (after.version, after.tokens, after.mem_tokens) == (meta.version, meta.tokens, meta.mem_tokens)
    # The memory is the one before the request: the same generation from here equals a fresh fork's.
    fork = await service.fork(OWNER, meta.id)
    _, again = await generate(service, meta.id, max_tokens=8)
    _, from_fork = await generate(service, fork.id, max_tokens=8)
    assert again.result.text == from_fork.result.text
    # The cancelled job left the worker.
    for _ in range(100):
        if runtime.worker.active_jobs == 0:
            break
        await asyncio.sleep(0.01)
    assert runtime.worker.active_jobs == 0


async def test_two_concurrent_steps_on_one_session_one_conflicts_no_update_lost(make_settings):
    rt = Runtime(make_settings(lease_wait_seconds=0))  # no waiting for the writer: the second one conflicts
    await rt.start()
    try:
        service = rt.service
        meta = await service.create(OWNER, text="start")
        results = await asyncio.gather(
            service.append(OWNER, meta.id, "x" * 400),
            service.append(OWNER, meta.id, "y" * 400),
            return_exceptions=True,
        )
        conflicts = [r for r in results if isinstance(r, Conflict)]
        successes = [r for r in results if not isinstance(r, Exception)]
        assert len(conflicts) == 1 and len(successes) == 1
        after = await check_cache_matches_redis(service, meta.id)
        assert after.version == meta.version + 1 and after.tokens == meta.tokens + 400
    finally:
        await rt.stop()


async def test_two_concurrent_steps_on_one_session_take_turns(runtime):
    service = runtime.service
    meta = await service.create(OWNER, text="start")
    results = await asyncio.gather(
        service.append(OWNER, meta.id, "x" * 400), service.append(OWNER, meta.id, "y" * 400)
    )
    assert sorted(r.session.version for r in results) == [meta.version + 1, meta.version + 2]
    after = await check_cache_matches_redis(service, meta.id)
    assert after.version == meta.version + 2 and after.tokens == meta.tokens + 800


async def test_sessions_are_scoped_to_their_owner(runtime):
    service = runtime.service
    meta = await service.create(OWNER, text="mine")
    for call in (
        service.get("tenant-b", meta.id),
        service.append("tenant-b", meta.id, "x"),
        service.fork("tenant-b", meta.id),
        service.delete("tenant-b", meta.id),
    ):
        with pytest.raises(NotFound):
            await call
    assert [m.id for m in await service.list_sessions("tenant-b")] == []
    assert meta.id in [m.id for m in await service.list_sessions(OWNER)]


async def test_ttl_expiry_frees_memory_and_metadata(runtime):
    service = runtime.service
    meta = await service.create(OWNER, text="short-lived", ttl_seconds=1)
    assert meta.id in service.cache
    await asyncio.sleep(1.3)
    assert await service.store.get(meta.id) is None  # Redis expired the metadata
    assert await service.reap_expired() >= 1
    assert meta.id not in service.cache
    assert meta.id not in [m.id for m in await service.list_sessions(OWNER)]


async def test_invalid_requests_change_nothing(runtime):
    service = runtime.service
    meta = await service.create(OWNER, text="abc")
    with pytest.raises(InvalidRequest):
        await service.create(OWNER, mem_len=10**6)
    with pytest.raises(InvalidRequest):
        await generate(service, meta.id, max_tokens=10**9)
    after = await check_cache_matches_redis(service, meta.id)
    assert after.version == meta.version


async def test_scoring_a_document_ten_times_mem_len_runs_in_constant_memory(runtime):
    service = runtime.service
    mem_len = service.default_mem_len
    text = ("It is a truth universally acknowledged. " * 40)[: 20 * mem_len]
    progress = []
    scorer = runtime.stateless
    short = await scorer.score(text[: 10 * mem_len], owner=OWNER)
    outcome = await scorer.score(
        text, owner=OWNER, token_logprobs=True, progress=lambda d, t: progress.append((d, t))
    )
    assert outcome.tokens == len(text) and outcome.bytes == len(text)
    assert progress[-1] == (len(text), len(text)) and len(progress) > 10
    # 10x or 20x mem_len: the memory is bounded by mem_len (plus a segment and the append headroom).
    per_position = service.model.memory_layout().bytes_per_position()
    segment = service.segment_len
    bound = (mem_len + segment + max(4 * segment, mem_len // 8, 16)) * per_position + 4 * 32
    assert short.memory_bytes <= bound and outcome.memory_bytes <= bound
    assert len(outcome.token_logprobs) == len(text) and all(math.isfinite(x) for x in outcome.token_logprobs)
    direct = score_tokens(service.model, [service.start_id, *text.encode()], mem_len=mem_len, segment_len=8)
    assert outcome.logprob == pytest.approx(direct.logprob, rel=1e-5)
    assert outcome.bits_per_byte == pytest.approx(-direct.logprob / math.log(2) / len(text), rel=1e-5)


@pytest.mark.parametrize("persistence", [Persistence.EVICT, Persistence.ALWAYS])
async def test_tier_round_trip_device_host_redis_is_exact(make_settings, persistence):
    per_session = None
    rt = Runtime(make_settings(persistence=persistence))
    await rt.start()
    try:
        service = rt.service
        probe = await service.create(OWNER, text="probe" * 4)
        per_session = service.cache.peek(probe.id).state.nbytes
    finally:
        await rt.stop()
    # Room for about two sessions on the device and two on the host: the rest goes to Redis.
    rt = Runtime(
        make_settings(
            persistence=persistence,
            device_memory_bytes=2 * per_session + 1,
            host_memory_bytes=2 * per_session + 1,
        )
    )
    await rt.start()
    try:
        service = rt.service
        sessions = [await service.create(OWNER, text=f"session number {i} says hello") for i in range(6)]
        expected = {}
        # Reference next tokens, taken from forks made while every memory was still on the device...
        tiers = {s.id: (await service.store.get(s.id)).tier for s in sessions}
        assert {DEVICE, HOST, "redis"} <= set(tiers.values())
        assert service.cache.used(DEVICE) <= service.cache.budget(DEVICE)
        assert service.cache.used(HOST) <= service.cache.budget(HOST)
        for s in sessions:
            tokens, _ = await generate(service, s.id, max_tokens=6)
            expected[s.id] = ([t.id for t in tokens], [t.logprob for t in tokens])
        # ...must equal what a server that never moved them computes.
        reference = Runtime(make_settings())
        await reference.start()
        try:
            for i, s in enumerate(sessions):
                fresh = await reference.service.create(OWNER, text=f"session number {i} says hello")
                tokens, _ = await generate(reference.service, fresh.id, max_tokens=6)
                assert expected[s.id][0] == [t.id for t in tokens]
                assert expected[s.id][1] == pytest.approx([t.logprob for t in tokens], abs=1e-5)
        finally:
            await reference.stop()
    finally:
        await rt.stop()


async def test_without_persistence_a_dropped_memory_is_gone_not_empty(make_settings):
    # Room for one session on the device and none on the host: the older one is dropped.
    rt = Runtime(make_settings(persistence=Persistence.NONE, device_memory_bytes=40_000, host_memory_bytes=1))
    await rt.start()
    try:
        service = rt.service
        # Texts longer than mem_len (32): each session at rest holds a full memory, and two do not fit.
        first = await service.create(OWNER, text="first " * 7)
        await service.create(OWNER, text="second " * 6)
        meta = await service.store.get(first.id)
        assert meta.tier == "gone"
        with pytest.raises(Gone):
            await service.append(OWNER, first.id, "more")
        assert (await service.store.get(first.id)).version == first.version
    finally:
        await rt.stop()


async def test_redis_outage_fails_cleanly_and_the_engine_recovers(make_settings, tmp_path):
    from txl_server.errors import Unavailable
    from txl_server.sessions.redis_server import EmbeddedRedis

    redis = EmbeddedRedis(tmp_path / "redis")
    redis.start()
    rt = Runtime(make_settings(redis_url=redis.url))
    await rt.start()
    try:
        service = rt.service
        meta = await service.create(OWNER, text="durable")
        redis.kill()
        with pytest.raises(Unavailable):
            await service.append(OWNER, meta.id, "lost?")
        with pytest.raises(Unavailable):
            await service.create(OWNER, text="new")
        restarted = type(redis)(tmp_path / "redis", port=redis.port)
        restarted.start()
        try:
            for _ in range(50):
                with contextlib.suppress(Unavailable):
                    after = await service.get(OWNER, meta.id)
                    break
                await asyncio.sleep(0.1)
            assert after.version == meta.version and after.tokens == meta.tokens
            outcome = await service.append(OWNER, meta.id, " again")
            assert outcome.session.version == meta.version + 1
        finally:
            restarted.stop()
    finally:
        await rt.stop()


def test_model_state_snapshot_round_trip(tiny_model_dir):
    from txl_server.engine.state import ModelState

    model = txl.load_pretrained(tiny_model_dir)
    with torch.no_grad():
        hidden, memory = model(torch.tensor([[1, 2, 3, 4]]), model.empty_memory(mem_len=3))
    state = ModelState(memory, hidden[0, -1], (3, 4))
    restored = ModelState.from_bytes(state.to_bytes(), model.memory_layout())
    assert restored.tail == (3, 4) and restored.mem_len == 3
    torch.testing.assert_close(restored.last_hidden, state.last_hidden, rtol=0, atol=0)
    for name, value in memory.to_tensors().items():
        torch.testing.assert_close(restored.memory.to_tensors()[name], value, rtol=0, atol=0)
    with pytest.raises(ValueError):
        ModelState.from_bytes(b"garbage", model.memory_layout())


async def test_sessions_per_tenant_are_limited(make_settings):
    rt = Runtime(make_settings(max_sessions_per_tenant=3))
    await rt.start()
    try:
        service = rt.service
        sessions = [await service.create(OWNER, text=str(i)) for i in range(3)]
        with pytest.raises(InvalidRequest, match="session limit"):
            await service.create(OWNER, text="one too many")
        with pytest.raises(InvalidRequest, match="session limit"):
            await service.fork(OWNER, sessions[0].id)
        assert (await service.create("another-tenant", text="fine")).tokens == 4
        await service.delete(OWNER, sessions[0].id)
        assert (await service.create(OWNER, text="room again")).version == 1
    finally:
        await rt.stop()


def test_session_ids_never_start_with_a_dash(monkeypatch):
    """`txl sessions show -abc...` would be read as an option: such draws are discarded, the next one kept."""
    draws = iter(["-" + "a" * 31, "-" + "b" * 31, "Q" + "c" * 31])
    monkeypatch.setattr(outcomes_module.secrets, "token_urlsafe", lambda n: next(draws))
    assert new_session_id() == "Q" + "c" * 31
    monkeypatch.undo()
    ids = [new_session_id() for _ in range(2000)]  # ~31 of these would start with '-' if nothing prevented it
    assert not any(i.startswith("-") for i in ids) and {len(i) for i in ids} == {32}


async def test_a_step_costs_two_redis_round_trips(runtime, monkeypatch):
    """Reading the metadata under the lease is one script, committing and handing the lease back another."""
    service = runtime.service
    meta = await service.create(OWNER, text="Round trips.")
    await service.append(OWNER, meta.id, "x")  # warm: scripts loaded
    calls = []
    original = service.store.redis.execute_command

    async def counted(*args, **kwargs):
        calls.append(args[0])
        return await original(*args, **kwargs)

    monkeypatch.setattr(service.store.redis, "execute_command", counted)
    outcome = await service.append(OWNER, meta.id, " more")
    assert outcome.session.version == 3
    assert calls == ["EVALSHA", "EVALSHA"], calls
    # The lease went back with the commit: another step can start at once.
    await service.append(OWNER, meta.id, "!")


async def test_a_fork_is_admitted_like_a_create(make_settings):
    """A fork is a new session: refused at the tenant's session limit, as a create is, and counted in it."""
    async with running(make_settings(max_sessions_per_tenant=2)) as rt:
        service = rt.service
        first = await service.create(OWNER, text="one")
        await service.fork(OWNER, first.id)
        with pytest.raises(InvalidRequest, match="session limit"):
            await service.fork(OWNER, first.id)
        with pytest.raises(InvalidRequest, match="session limit"):
            await service.create(OWNER, text="three")


async def test_a_stopped_runtime_gives_its_device_pool_back(make_settings):
    rt = Runtime(make_settings())
    await rt.start()
    meta = await rt.service.create(OWNER, text="some text to hold")
    pool = rt.worker.pool
    assert pool.keys.device.type == "cpu"
    await rt.stop()
    assert pool.keys.device.type == "meta" and pool.values.device.type == "meta"
    # The session was saved before the pool went: a new runtime on the same Redis continues it.
    rt = Runtime(rt.settings)
    await rt.start()
    try:
        assert (await rt.service.get(OWNER, meta.id)).tokens == meta.tokens
    finally:
        await rt.stop()
