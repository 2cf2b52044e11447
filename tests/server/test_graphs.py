"""Decoding iterations through the static buffers a CUDA graph captures give what the eager runner gives.

On a CPU the buffers run eagerly (no capture): the same inputs, padding rows and sampling; on a CUDA device the
iteration is captured and replayed (that test is skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch
import txl
from txl.sampling import SamplingParams
from txl_server.engine.graphs import DecodeGraphs, buckets
from txl_server.engine.runner import DecodeRow, ModelRunner
from txl_server.runtime import Runtime

from ..model.helpers import tiny_model

PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.1, top_k=5, seed=2),
    SamplingParams(top_p=0.6, seed=3),
    SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
]


def _rows(model, pool, lengths):
    generator = torch.Generator().manual_seed(5)
    rows = []
    with torch.inference_mode():
        for i, n in enumerate(lengths):
            memory = model.empty_memory(1, mem_len=24, pool=pool)
            tokens = torch.randint(0, 64, (1, n), generator=generator).to(model.device)
            hidden, memory = model(tokens, memory)
            rows.append(DecodeRow(memory, hidden[0, -1].clone(), PARAMS[i % len(PARAMS)], 100 + i, i))
    return rows


def _compare(device: str, capture: bool) -> None:
    model = tiny_model(seed=41, mem_len=24, same_length=True).to(device)
    pool = txl.BlockPool(model.memory_layout(), block_size=4)
    graphs = DecodeGraphs(model, pool, max_batch_size=8, max_mem_len=24, capture=capture)
    eager = ModelRunner(model, pool)
    for lengths in ([1, 7, 30], [2, 3, 5, 8, 13, 21], [24]):  # buckets 4, 8 and 1: padding rows in two
        rows = _rows(model, pool, lengths)
        expected, _ = eager.run(rows, [])
        got = graphs.run(rows)
        assert [o.token for o in got] == [o.token for o in expected]
        assert [o.logprob for o in got] == pytest.approx([o.logprob for o in expected], abs=1e-5)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a.last_hidden, b.last_hidden, rtol=0, atol=1e-5)
            assert a.memory.length == b.memory.length
        # Two steps more, each from the last: the memories the graph path returned continue like the eager ones.
        for _ in range(2):
            rows = [
                DecodeRow(o.memory, o.last_hidden, r.params, r.seed, r.counter + 1)
                for o, r in zip(got, rows, strict=True)
            ]
            got = graphs.run(rows)
            expected, _ = eager.run(rows, [])
            assert [o.token for o in got] == [o.token for o in expected]


def test_buckets_cover_every_batch_size():
    assert buckets(1) == [1]
    assert buckets(48) == [1, 2, 4, 8, 16, 32, 48]


def test_static_decode_buffers_give_the_eager_results():
    _compare("cpu", capture=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_decode_graphs_give_the_eager_results():
    _compare("cuda", capture=True)


async def test_an_engine_decoding_through_the_buffers_generates_what_it_did_without(make_settings):
    outputs = []
    for graphs in (False, True):
        rt = Runtime(make_settings(cuda_graphs=graphs))
        await rt.start()
        try:
            service = rt.service
            texts = []
            for i, prompt in enumerate(["a", "The sea was", "1234567890 abcdefghij"]):
                meta = await service.create("t", text=prompt)
                sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=i)
                events = [e async for e in service.generate("t", meta.id, max_tokens=12, sampling=sampling)]
                texts.append([e.id for e in events if hasattr(e, "id")])
            outputs.append(texts)
        finally:
            await rt.stop()
    assert outputs[0] == outputs[1]
