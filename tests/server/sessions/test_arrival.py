"""A session's state is a function of its tokens alone: however its text arrived (one create, appends of any
size, token by token, a fork, generated tokens), what follows gets the same log-probabilities."""

from __future__ import annotations

import random

import pytest
import torch
from txl.sampling import SamplingParams

from tests.helpers.runtimes import OWNER, generate

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity."
)
PROBE = "Seventeen bytes.."  # the same append after every arrival


def _expected(service, ids: list[int]) -> float:
    """log p(PROBE | ids), from the model fed everything in one pass with the server's windows."""
    model, probe = service.model, list(PROBE.encode())
    with torch.inference_mode():
        memory = model.empty_memory(1, mem_len=service.default_mem_len, grid=service.worker.grid)
        hidden, _ = model(torch.tensor([ids + probe]), memory)
        scores = model.target_log_probs(hidden[0, len(ids) - 1 : -1], torch.tensor(probe))
    return float(scores.double().sum())


async def _probe(service, session_id: str) -> float:
    return (await service.append(OWNER, session_id, PROBE)).logprob


async def test_every_way_a_text_can_arrive_gives_what_one_create_gives(runtime):
    service = runtime.service
    ids = [service.start_id, *TEXT.encode()]
    expected = _expected(service, ids)
    assert await _probe(service, (await service.create(OWNER, text=TEXT)).id) == pytest.approx(
        expected, abs=1e-4
    )

    rng = random.Random(7)
    for trial in range(4):
        cuts = sorted(rng.sample(range(1, len(TEXT)), 3 + trial))
        pieces = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)], strict=True)]
        meta = await service.create(OWNER, text=pieces[0])
        for piece in pieces[1:]:
            await service.append(OWNER, meta.id, piece)
        assert await _probe(service, meta.id) == pytest.approx(expected, abs=1e-4), cuts

    meta = await service.create(OWNER)  # nothing but the start, then one byte at a time for a stretch
    for char in TEXT[:20]:
        await service.append(OWNER, meta.id, char)
    await service.append(OWNER, meta.id, TEXT[20:])
    assert await _probe(service, meta.id) == pytest.approx(expected, abs=1e-4)

    parent = await service.create(OWNER, text=TEXT[:53])  # a fork mid-segment, continued on both sides
    child = await service.fork(OWNER, parent.id)
    await service.append(OWNER, child.id, TEXT[53:])
    await service.append(OWNER, parent.id, TEXT[53:90])
    await service.append(OWNER, parent.id, TEXT[90:])
    assert await _probe(service, child.id) == pytest.approx(expected, abs=1e-4)
    assert await _probe(service, parent.id) == pytest.approx(expected, abs=1e-4)


async def test_generated_tokens_continue_like_the_same_tokens_read_at_once(runtime):
    service = runtime.service
    meta = await service.create(OWNER, text=TEXT[:37])
    events, _ = await generate(
        service, meta.id, max_tokens=29, sampling=SamplingParams(temperature=0.9, seed=3)
    )
    ids = [service.start_id, *TEXT[:37].encode(), *(e.id for e in events)]
    assert await _probe(service, meta.id) == pytest.approx(_expected(service, ids), abs=1e-4)
