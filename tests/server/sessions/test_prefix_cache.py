"""The prefix cache: a prompt that begins like one read before starts from the state at the longest shared
segment boundary; a hit gives exactly what a miss computes, tenants never share, the budget holds, and concurrent
identical prefixes are read once. First the cache and its reader on their own, over a fake worker
(tests/helpers/session_fakes.py); then through a runtime and a live server."""

from __future__ import annotations

import asyncio

import pytest
from openai import OpenAI
from txl.sampling import SamplingParams
from txl_server.engine.jobs import AdvanceResult, Boundary
from txl_server.engine.worker import WorkerObserver
from txl_server.sessions.prefix_cache import CachedBoundary, PrefixCache, PromptReader
from txl_server.settings import Persistence

from tests.helpers import session_fakes as fakes
from tests.helpers.live_server import live_server_fixture
from tests.helpers.runtimes import OWNER, generate, running

GRID = fakes.BLOCK
START = 0  # the start token every prompt is read after


def boundary(block_pool, positions: int, logprob: float = -1.0) -> CachedBoundary:
    return CachedBoundary(fakes.state(block_pool, positions), [logprob] * GRID)


def test_keys_chain_and_never_match_across_owners_or_memory_lengths():
    cache = PrefixCache(budget_bytes=10_000, grid=GRID, salt="model")
    ids = list(range(13))
    keys = cache.keys("alice", 64, ids)
    assert len(keys) == 3 and keys == cache.keys("alice", 64, ids)  # one per whole segment
    assert set(keys).isdisjoint(cache.keys("bob", 64, ids)) and set(keys).isdisjoint(
        cache.keys("alice", 32, ids)
    )
    changed = cache.keys("alice", 64, [*ids[:5], 99, *ids[6:]])  # a token of the second segment
    assert changed[0] == keys[0] and changed[1] != keys[1] and changed[2] != keys[2]


def test_lookup_finds_the_longest_cached_boundary_within_the_limit():
    block_pool = fakes.pool()
    cache = PrefixCache(budget_bytes=10_000, grid=GRID, salt="model")
    keys = cache.keys("alice", 64, list(range(13)))
    cache.put(keys[0], boundary(block_pool, 4, -1.0))
    cache.put(keys[2], boundary(block_pool, 12, -3.0))  # its parent (keys[1]) is not cached
    assert cache.lookup(keys, limit=13, with_logprobs=False).fed == 12
    assert cache.lookup(keys, limit=11, with_logprobs=False).fed == 4  # a prompt of 11 positions
    # Scores wanted: only a boundary whose every earlier one is cached gives every token's log-prob.
    scored = cache.lookup(keys, limit=13, with_logprobs=True)
    assert scored.fed == 4 and scored.logprobs == [-1.0] * GRID
    cache.put(keys[1], boundary(block_pool, 8, -2.0))
    assert cache.lookup(keys, limit=13, with_logprobs=True).logprobs == [-1.0] * 4 + [-2.0] * 4 + [-3.0] * 4


def test_the_budget_holds_and_a_chain_is_cut_from_its_end():
    block_pool = fakes.pool()
    per_entry = fakes.state_bytes(4)  # one block and a hidden state
    cache = PrefixCache(budget_bytes=3 * per_entry, grid=GRID, salt="model")
    chain = cache.keys("alice", 64, list(range(9)))
    cache.put(chain[0], boundary(block_pool, 4))
    cache.put(chain[1], CachedBoundary(fakes.state(block_pool, 4), [-1.0] * GRID, parent=chain[0]))
    cache.put("other", boundary(block_pool, 4))
    assert cache.used == 3 * per_entry
    cache.put(
        "newest", boundary(block_pool, 4)
    )  # over budget: the chain's end goes, though its start is older
    assert cache.used <= cache.budget and len(cache) == 3
    assert cache.lookup(chain, limit=9, with_logprobs=True).fed == 4
    disabled = PrefixCache(budget_bytes=0, grid=GRID, salt="model")
    disabled.put("k", boundary(block_pool, 4))
    assert len(disabled) == 0


class Reader:
    """A prompt reader over a fake worker whose job caches a boundary at every multiple of the grid."""

    def __init__(self) -> None:
        self.worker = fakes.FakeWorker(fakes.pool(), grid=GRID)
        self.worker.compute = self.advance
        self.cache = PrefixCache(budget_bytes=100_000, grid=GRID, salt="model")
        self.reader = PromptReader(self.cache, self.worker, START)

    async def advance(self, job) -> AdvanceResult:
        fed, end = job.state.fed, job.state.fed + len(job.tokens)
        first = (fed // GRID + 1) * GRID
        reached = [
            Boundary(fakes.state(self.worker.pool, b), [-1.0] * GRID) for b in range(first, end + 1, GRID)
        ]
        logprobs = [-1.0] * len(job.tokens) if job.token_logprobs else None
        after = fakes.state(self.worker.pool, end)
        return AdvanceResult(after, len(job.tokens), -float(len(job.tokens)), logprobs, boundaries=reached)

    def fed(self) -> list[int]:
        return [len(job.tokens) for job in self.worker.jobs]


async def test_a_prompt_that_begins_like_an_earlier_one_feeds_only_the_rest():
    r = Reader()
    first = await r.reader.read("alice", list(range(1, 11)), mem_len=64)  # 11 positions: boundaries 4 and 8
    assert first.cached == 0 and len(r.cache) == 2
    progress: list[tuple[int, int]] = []
    longer = await r.reader.read(
        "alice", list(range(1, 14)), mem_len=64, progress=lambda *p: progress.append(p)
    )
    assert longer.cached == 8 and longer.state.fed == 14 and progress[0] == (7, 13)
    other = await r.reader.read("bob", list(range(1, 11)), mem_len=64)
    assert other.cached == 0
    assert r.fed() == [11, 6, 11]


async def test_a_scored_prompt_takes_the_cached_tokens_log_probs_too():
    r = Reader()
    await r.reader.read("alice", list(range(1, 11)), mem_len=64)
    scored = await r.reader.read("alice", list(range(1, 11)), mem_len=64, scores=True)
    assert scored.cached == 8 and scored.token_logprobs == [-1.0] * 11 and scored.logprob == -11.0
    unread = await r.reader.read("alice", list(range(1, 11)), mem_len=64, through_cache=False)
    assert unread.cached == 0


async def test_identical_prompts_at_once_are_read_once():
    r = Reader()
    r.worker.gate.clear()
    reads = [asyncio.ensure_future(r.reader.read("alice", list(range(1, 11)), mem_len=64)) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert r.fed() == [11]  # the others wait for the first build
    r.worker.gate.set()
    outcomes = await asyncio.gather(*reads)
    assert r.fed() == [11, 3, 3] and [o.cached for o in outcomes] == [0, 8, 8]


DOCUMENT = "The lighthouse stood on the northern rock, and every night its keeper climbed the stair. " * 3


async def test_a_hit_scores_exactly_what_a_miss_computes(make_settings):
    async with running(make_settings()) as rt, running(make_settings(prefix_cache_bytes=0)) as cold:
        warm = rt.stateless
        first = await warm.score(DOCUMENT, owner=OWNER)
        assert first.cached_tokens == 0
        again = await warm.score(DOCUMENT + " Then the storm came.", owner=OWNER, token_logprobs=True)
        miss = await cold.stateless.score(
            DOCUMENT + " Then the storm came.", owner=OWNER, token_logprobs=True
        )
        grid = rt.worker.grid
        assert again.cached_tokens == (len(DOCUMENT) + 1) // grid * grid - 1 > 200
        assert again.logprob == pytest.approx(miss.logprob, abs=1e-4)
        assert again.token_logprobs == pytest.approx(miss.token_logprobs, abs=1e-5)
        # Another tenant's identical text is never served from this one's entries.
        other = await warm.score(DOCUMENT + " Then the storm came.", owner="someone-else")
        assert other.cached_tokens == 0 and other.logprob == pytest.approx(miss.logprob, abs=1e-4)


async def test_sessions_and_completions_created_from_a_hit_continue_like_a_miss(make_settings):
    greedy = SamplingParams(temperature=0)
    async with running(make_settings(persistence=Persistence.ALWAYS)) as rt:
        service = rt.service
        await service.create(OWNER, text=DOCUMENT)
        hit = await service.create(OWNER, text=DOCUMENT + "Tonight")
        events, _ = await generate(service, hit.id, max_tokens=30, sampling=greedy)
        _, scores = await rt.stateless.prefill(
            list((DOCUMENT + "Tonight").encode()), owner=OWNER, logprobs=True, top_logprobs=0
        )
        assert scores.cached_tokens > 200
    async with running(make_settings(prefix_cache_bytes=0)) as cold:
        miss = await cold.service.create(OWNER, text=DOCUMENT + "Tonight")
        expected, _ = await generate(cold.service, miss.id, max_tokens=30, sampling=greedy)
        _, cold_scores = await cold.stateless.prefill(
            list((DOCUMENT + "Tonight").encode()), owner=OWNER, logprobs=True, top_logprobs=0
        )
    assert [e.id for e in events] == [e.id for e in expected]
    assert scores.logprobs == pytest.approx(cold_scores.logprobs, abs=1e-5)


async def test_the_cache_keeps_within_its_budget_least_recently_used_first(make_settings):
    block_bytes = 16 * 512  # the tiny test model: 16 positions of 512 bytes
    async with running(make_settings(prefix_cache_bytes=40 * block_bytes)) as rt:
        cache = rt.service.prefix_cache
        for i in range(6):
            await rt.stateless.score(f"Document number {i}. " * 12, owner=OWNER)
            assert cache.used <= cache.budget
        assert len(cache) > 0
        recent = await rt.stateless.score("Document number 5. " * 12, owner=OWNER)
        oldest = await rt.stateless.score("Document number 0. " * 12, owner=OWNER)
        # The oldest document's own part is gone; what all of them begin with ("Document number ") stays.
        assert recent.cached_tokens > 200 and oldest.cached_tokens <= len("Document number ")


class _Fed(WorkerObserver):
    def __init__(self) -> None:
        self.tokens = 0

    def on_prefill(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens


async def test_sixteen_identical_prompts_at_once_are_read_once(make_settings):
    fed = _Fed()
    runtime_settings = make_settings()
    from txl_server.runtime import Runtime

    rt = Runtime(runtime_settings, worker_observer=fed)
    await rt.start()
    try:
        text = DOCUMENT * 2
        outcomes = await asyncio.gather(*(rt.stateless.score(text, owner=OWNER) for _ in range(16)))
        ids = len(text) + 1
        tail = ids % rt.worker.grid  # what follows the last boundary: read by every request
        assert fed.tokens <= ids + 15 * tail
        assert len({o.logprob for o in outcomes}) == 1
        assert sum(o.cached_tokens > 0 for o in outcomes) == 15
    finally:
        await rt.stop()


server = live_server_fixture("prefix")


def test_openai_usage_reports_cached_prompt_tokens_and_metrics_count_them(server):
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    prompt = "Few-shot: cat -> chat; dog -> chien; bird -> oiseau; horse -> cheval; " * 3
    first = client.completions.create(model=model, prompt=prompt + "mouse ->", max_tokens=8, temperature=0)
    second = client.completions.create(model=model, prompt=prompt + "house ->", max_tokens=8, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= len(prompt) - 16
    metrics = server.client().get("/metrics").text
    assert 'txl_prefix_cache_lookups_total{outcome="hit"}' in metrics
    cached = [
        line
        for line in metrics.splitlines()
        if line.startswith('txl_prefix_cache_tokens_total{source="cache"}')
    ]
    assert float(cached[0].split()[-1]) >= len(prompt) - 16


async def test_a_document_longer_than_the_cache_holds_keeps_its_beginning(make_settings, monkeypatch):
    """A read keeps only the boundaries the budget can hold (the first ones), instead of holding every boundary of
    a long document until its end and then letting the cache drop most of them: what stays is a prefix, whose
    every token keeps its log-prob."""
    block_bytes = 16 * 512  # the tiny test model: 16 positions of 512 bytes
    async with running(make_settings(prefix_cache_bytes=12 * block_bytes)) as rt:
        cache, pool = rt.service.prefix_cache, rt.worker.pool
        keep = cache.boundaries_within_budget(pool.block_nbytes, pool.block_size)
        put = []
        original = type(cache).put
        monkeypatch.setattr(
            type(cache), "put", lambda self, key, b: (put.append(key), original(self, key, b))
        )
        document = DOCUMENT * 4
        first = await rt.stateless.score(document, owner=OWNER)
        assert len(put) == keep < len(document) // rt.worker.grid
        assert 0 < cache.used <= cache.budget
        again = await rt.stateless.score(document, owner=OWNER, token_logprobs=True)
        assert again.cached_tokens >= (keep // 2) * rt.worker.grid  # a hit that needs every earlier boundary
        assert again.logprob == pytest.approx(first.logprob, abs=1e-4)
