"""Decoding one step ahead of the device: each iteration is sent before the previous one's tokens are read. The
tokens, texts and finish reasons are those of the synchronous loop (with and without graphs), stop strings and
token limits end a generation where they did, and a cancelled generation leaves its session as it was."""

from __future__ import annotations

import asyncio

import pytest
from txl.sampling import SamplingParams
from txl_server.engine import graphs as graphs_module
from txl_server.sessions.service import GenerateOutcome

from tests.helpers.runtimes import OWNER, leave_after, running

REQUESTS = [
    ("It was a dark and stormy", dict(max_tokens=30, sampling=SamplingParams(temperature=0.9, seed=1))),
    ("Call me", dict(max_tokens=7, sampling=SamplingParams(temperature=0))),
    ("The sea", dict(max_tokens=40, sampling=SamplingParams(temperature=1.2, top_k=20, seed=2))),
    ("1234", dict(max_tokens=25, sampling=SamplingParams(top_p=0.8, seed=3), stop=["zz", "q"])),
    ("Once", dict(max_tokens=1, sampling=SamplingParams(temperature=0.7, seed=4))),
]


async def _generate_all(settings, requests=REQUESTS) -> list[tuple[list[int], str, str]]:
    async with running(settings) as rt:
        service = rt.service

        async def one(prompt, kwargs):
            meta = await service.create(OWNER, text=prompt)
            ids, outcome = [], None
            async for event in service.generate(OWNER, meta.id, **kwargs):
                if isinstance(event, GenerateOutcome):
                    outcome = event
                else:
                    ids.append(event.id)
            return ids, outcome.result.text, outcome.result.finish_reason

        return await asyncio.gather(*(one(p, k) for p, k in requests))


async def test_overlapped_decoding_gives_what_the_synchronous_loop_gives(make_settings, monkeypatch):
    order = []
    launch, collect = graphs_module.DecodeGraphs.launch, graphs_module.Launched.collect

    def recording_launch(self, rows):
        order.append("launch")
        return launch(self, rows)

    def recording_collect(self):
        order.append("collect")
        return collect(self)

    # A stop string the third request meets midway (its text without one, seeded, from a first run).
    (_, text, _), *_ = await _generate_all(make_settings(), [REQUESTS[2]])
    stop = text.encode()[12:14].decode(errors="ignore") or text[12:14]
    requests = list(REQUESTS)
    requests[2] = (REQUESTS[2][0], {**REQUESTS[2][1], "stop": [stop]})
    monkeypatch.setattr(graphs_module.DecodeGraphs, "launch", recording_launch)
    monkeypatch.setattr(graphs_module.Launched, "collect", recording_collect)
    overlapped = await _generate_all(make_settings(cuda_graphs=True, overlap=True), requests)
    assert "launch,launch,collect" in ",".join(order)  # an iteration was sent before the previous was read
    synchronous = await _generate_all(make_settings(cuda_graphs=True, overlap=False), requests)
    eager = await _generate_all(make_settings(cuda_graphs=False), requests)
    assert overlapped == synchronous == eager
    assert [len(ids) for ids, _, _ in overlapped][1::3] == [7, 1]  # token limits hold
    assert overlapped[2][2] == "stop" and overlapped[2][1] == text[: text.index(stop)]


async def test_a_generation_cancelled_mid_flight_leaves_its_session_and_the_others_go_on(make_settings):
    async with running(make_settings(cuda_graphs=True, overlap=True)) as rt:
        service = rt.service
        victim = await service.create(OWNER, text="Cancel me")
        other = await service.create(OWNER, text="Keep me")
        before = await service.get(OWNER, victim.id)
        stream = service.generate(OWNER, victim.id, max_tokens=200, sampling=SamplingParams(temperature=0))
        survivor = asyncio.create_task(
            _collect_ids(
                service.generate(OWNER, other.id, max_tokens=60, sampling=SamplingParams(temperature=0))
            )
        )
        await leave_after(stream, 5)
        ids = await survivor
        assert len(ids) == 60
        after = await service.get(OWNER, victim.id)
        assert after.version == before.version and after.tokens == before.tokens
        again = await _collect_ids(
            service.generate(OWNER, victim.id, max_tokens=5, sampling=SamplingParams(temperature=0))
        )
        assert len(again) == 5


async def _collect_ids(events) -> list[int]:
    ids = []
    async for event in events:
        if not isinstance(event, GenerateOutcome):
            ids.append(event.id)
    return ids


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_follows_the_graphs(make_settings, overlap):
    from txl_server.runtime import load_model, make_worker

    settings = make_settings(cuda_graphs=False, overlap=overlap)
    worker = make_worker(settings, load_model(settings))
    assert worker.overlap is False  # no graphs: every iteration runs in step
