"""The prefix cache: a prompt that begins like one read before starts from the state at the longest shared
segment boundary; a hit gives exactly what a miss computes, tenants never share, the budget holds, and concurrent
identical prefixes are read once."""

from __future__ import annotations

import asyncio

import pytest
from openai import OpenAI
from txl.sampling import SamplingParams
from txl_server.engine.worker import WorkerObserver
from txl_server.settings import Persistence

from tests.helpers.live_server import live_server_fixture
from tests.helpers.runtimes import OWNER, generate, running

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
