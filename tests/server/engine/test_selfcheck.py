"""Start-up on the device (engine.selfcheck): every decoding graph is made and checked against the eager path
before the server is ready, the decode path's kernels are checked against its torch variant, and a piece that
fails (a capture that raises, a graph that differs, a Triton kernel that raises) is turned off once, in one log
line, while the server stays ready and serves the tokens it serves without it.

On a CPU the graphs' static buffers run eagerly ("capture" builds them) and Triton runs only under its
interpreter, so the faults are injected where a GPU would raise them."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import txl
from txl.kernels.cpu import prefill_attention
from txl.kernels.cpu.prefill_attention import cpu_prefill_attention
from txl.kernels.triton import common as triton_common
from txl.kernels.triton import decode as triton_decode
from txl.sampling import SamplingParams
from txl_server.engine import graphs as graphs_module
from txl_server.engine import selfcheck
from txl_server.engine.graphs import DecodeGraphs, top_k_bucket, top_k_buckets
from txl_server.engine.rows import DecodeRow
from txl_server.engine.runner import ModelRunner

from tests.helpers.interpreted import run_interpreted
from tests.helpers.runtimes import OWNER, generate, running
from tests.helpers.tiny_models import tiny_model

from .graph_cases import decode_rows, graphs_over

PROMPTS = ["The sea was", "1234567890 abcdefghij", "a"]
SAMPLING = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.9, top_p=0.95, seed=3),
    SamplingParams(temperature=1.1, top_k=5, seed=4),
]
TRITON_FAILURE = "Failed to find C compiler. Please specify via CC environment variable."


async def _tokens(runtime) -> list[list[int]]:
    out = []
    for prompt, sampling in zip(PROMPTS, SAMPLING, strict=True):
        meta = await runtime.service.create(OWNER, text=prompt)
        events, _ = await generate(runtime.service, meta.id, max_tokens=10, sampling=sampling)
        out.append([e.id for e in events])
    return out


@pytest.fixture
async def eager_tokens(make_settings):
    """What the server generates without graphs: the reference for every fault."""
    async with running(make_settings(cuda_graphs=False)) as runtime:
        return await _tokens(runtime)


def _pool_is_free(runtime) -> bool:
    """Nothing of the start-up checks' dummy rows stays in the pool: only the graphs' scratch block is used."""
    return runtime.worker.pool.used_blocks == (0 if runtime.worker.runner.graphs is None else 1)


def _count_builds(monkeypatch, make_graph=None) -> list[int]:
    """Counts DecodeGraphs._build calls; `make_graph(graph)` may alter or replace each graph built."""
    calls: list[int] = []
    build = DecodeGraphs._build

    def counting(self, *key):
        calls.append(1)
        graph = build(self, *key)
        return make_graph(graph) if make_graph is not None else graph

    monkeypatch.setattr(graphs_module.DecodeGraphs, "_build", counting)
    return calls


async def test_every_graph_is_made_and_checked_at_start_up_and_none_while_serving(
    make_settings, monkeypatch, eager_tokens
):
    calls = _count_builds(monkeypatch)
    async with running(make_settings(cuda_graphs=True)) as runtime:
        graphs = runtime.worker.runner.graphs
        # 16 rows at most: batch 1, 2, 4, 8, 16 x top-k none, 64, 255 (the byte vocabulary) x top-p or not.
        assert len(graphs.all_keys()) == 5 * 3 * 2 == len(calls) == graphs.built
        report = runtime.device_report()
        assert report.cuda_graphs == "on" and report.graphs == 30 and _pool_is_free(runtime)
        checked = [c for c in runtime.serving.checks if c.what.startswith("the graph")]
        assert len(checked) == 30 and all(c.ok for c in runtime.serving.checks)
        assert await _tokens(runtime) == eager_tokens
        assert len(calls) == 30  # nothing made while serving
        assert await runtime.ready()


async def test_a_capture_that_raises_turns_the_graphs_off_once_and_the_device_serves_on(
    make_settings, monkeypatch, caplog, eager_tokens
):
    def raising(graph):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    calls = _count_builds(monkeypatch, raising)
    with caplog.at_level(logging.WARNING, logger="txl_server.engine.graphs"):
        async with running(make_settings(cuda_graphs=True)) as runtime:
            report = runtime.device_report()
            assert report.cuda_graphs == "off" and "capturing them failed" in report.cuda_graphs_reason
            assert "operation not permitted" in report.cuda_graphs_reason and _pool_is_free(runtime)
            assert await _tokens(runtime) == eager_tokens
            assert await runtime.ready() and runtime.worker.device_error is None
    assert len(calls) == 1  # never retried, not at start-up, not while serving
    warnings = [r for r in caplog.records if "CUDA graphs are off" in r.getMessage()]
    assert len(warnings) == 1, caplog.text


def _writes_nothing(graph):
    graph.replay = lambda: None  # the outputs keep the poison the check filled them with
    return graph


def _slightly_off(graph):
    replay = graph.replay

    def off() -> None:
        replay()
        graph.hidden_out.add_(0.01)

    graph.replay = off
    return graph


@pytest.mark.parametrize("fault", [_writes_nothing, _slightly_off], ids=["writes-nothing", "off-by-0.01"])
async def test_a_graph_that_differs_from_eager_turns_the_graphs_off(
    make_settings, monkeypatch, fault, eager_tokens
):
    _count_builds(monkeypatch, fault)
    async with running(make_settings(cuda_graphs=True)) as runtime:
        report = runtime.device_report()
        assert report.cuda_graphs == "off", report
        assert "differs from the eager path" in report.cuda_graphs_reason
        assert "hidden states off by" in report.cuda_graphs_reason and _pool_is_free(runtime)
        assert await _tokens(runtime) == eager_tokens
        assert await runtime.ready()


@pytest.fixture
def failing_triton(monkeypatch):
    """Triton kernels that can run here (as on a GPU) but raise, as in an image with no C compiler."""
    calls: list[int] = []

    def raising(*args, **kwargs):
        calls.append(1)
        raise RuntimeError(TRITON_FAILURE)

    monkeypatch.setattr(triton_common, "available", lambda device: True)
    monkeypatch.setattr(triton_common, "launch", raising)
    monkeypatch.setattr(triton_decode, "triton_paged_decode", raising)
    return calls


async def test_a_triton_kernel_that_raises_is_replaced_before_the_graphs_are_made(
    make_settings, eager_tokens, failing_triton, caplog
):
    with caplog.at_level(logging.WARNING, logger="txl_server.engine.selfcheck"):
        async with running(make_settings(cuda_graphs=True)) as runtime:
            report = runtime.device_report()
            assert report.attention in ("c", "torch") and TRITON_FAILURE in report.attention_reason
            assert _pool_is_free(runtime)
            # The graphs are made with the kernel that replaced it, and pass.
            failed = [c.what for c in runtime.serving.failures]
            assert report.cuda_graphs == "on" and failed == ["the triton kernels vs the torch path"]
            assert await _tokens(runtime) == eager_tokens
            assert await runtime.ready()
    assert len(failing_triton) == 1  # the start-up check only: serving never called it
    assert sum("does not use those kernels" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.skipif(cpu_prefill_attention() is None, reason="no C compiler for the CPU prefill kernel")
async def test_a_cpu_prefill_kernel_that_differs_turns_the_native_kernels_off(
    make_settings, monkeypatch, eager_tokens
):
    """The start-up check's scored segment takes the prefill kernel: one that is off by 0.01 turns "c" off, and
    both decoding and prompts take the torch path (the same tokens as the eager reference)."""
    calls: list[int] = []
    call = prefill_attention.PrefillAttentionKernel.__call__

    def slightly_off(self, *args):
        calls.append(1)
        return call(self, *args) + 0.01

    monkeypatch.setattr(prefill_attention.PrefillAttentionKernel, "__call__", slightly_off)
    async with running(make_settings(cuda_graphs=False)) as runtime:
        report = runtime.device_report()
        assert report.attention == "torch" and "the c kernels" in report.attention_reason
        checked = len(calls)
        assert checked and _pool_is_free(runtime) and await runtime.ready()
        assert await _tokens(runtime) == eager_tokens
        assert len(calls) == checked  # serving never called it


async def test_triton_switched_off_is_never_run(make_settings, eager_tokens, failing_triton):
    async with running(make_settings(triton_kernels=False)) as runtime:
        report = runtime.device_report()
        assert report.attention != "triton" and "TXL_TRITON_KERNELS=0" in report.attention_reason
        assert await _tokens(runtime) == eager_tokens
    assert not failing_triton


async def test_a_sticky_device_error_at_start_up_makes_the_server_not_ready(make_settings, monkeypatch):
    """An illegal address poisons the context: the device then runs nothing (simulated: the probe fails)."""

    def poisoned(graph):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    _count_builds(monkeypatch, poisoned)
    monkeypatch.setattr(selfcheck, "device_works", lambda device: False)
    async with running(make_settings(cuda_graphs=True)) as runtime:
        assert runtime.worker.device_error.startswith("AcceleratorError: CUDA error")
        assert not await runtime.ready() and not runtime.device_report().device_ok


def test_the_switches_in_every_combination_serve_the_same_tokens(tiny_model_dir):
    """TXL_CUDA_GRAPHS and TXL_TRITON_KERNELS on and off, with Triton under its interpreter (a process of its
    own: Triton reads the switch when imported) and the graphs' static buffers."""
    if triton_decode.triton is None:
        pytest.skip("triton is not installed")
    done = run_interpreted("tests.server.engine.switch_cases", str(tiny_model_dir), timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 4
    for line in lines:
        assert (line["attention"] == "triton") == line["triton"], line
        assert (line["cuda_graphs"] == "on") == line["graphs"], line
        assert line["checks_ok"], line
    assert all(line["tokens"] == lines[0]["tokens"] for line in lines)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("sampling-raises", "Failed to find C compiler"), ("top-p-differs", "differs from the eager path")],
)
def test_a_triton_sampling_kernel_that_fails_turns_triton_off_and_top_p_is_served(
    tiny_model_dir, fault, reason
):
    """Triton's sampling kernel raising (no C compiler, a driver mismatch), or its top-p threshold search wrong,
    while Triton's other kernels run, under Triton's interpreter: the start-up check samples greedy, top-k and
    top-p rows through it, so Triton is turned off for everything, sampling included (logged); top-p requests
    are then served (graphs on), the tokens those without Triton give. (Before: the check sampled greedily, Triton
    stayed on, and top-p requests got other tokens, or on CUDA failed.)"""
    if triton_decode.triton is None:
        pytest.skip("triton is not installed")
    done = run_interpreted("tests.server.engine.switch_cases", str(tiny_model_dir), fault, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    line, reference = [json.loads(text) for text in done.stdout.splitlines()]
    assert line["attention"] != "triton" and reason in line["attention_reason"], line
    assert (
        line["cuda_graphs"] == "on" and len(line["tokens"]) == 3 and all(len(t) == 5 for t in line["tokens"])
    )
    assert not reference["triton"] and line["tokens"] == reference["tokens"]
    assert (
        "does not use those kernels: the torch path takes their parts" in done.stderr
    )  # the fallback, logged


def test_top_k_buckets_are_few_and_a_larger_top_k_runs_eagerly():
    assert top_k_buckets(256) == [0, 64, 255] and top_k_buckets(267735) == [0, 64, 512]

    def rows(*top_k: int) -> list[DecodeRow]:
        return [DecodeRow(None, None, SamplingParams(top_k=k), 0, 0) for k in top_k]  # type: ignore[arg-type]

    assert top_k_bucket(rows(0, 0), 1000) == 0 and top_k_bucket(rows(5, 0), 1000) == 64
    assert top_k_bucket(rows(65, 3), 1000) == 512 and top_k_bucket(rows(600), 1000) is None
    assert top_k_bucket(rows(600), 600) == 0  # the whole vocabulary is no limit
    model = tiny_model(seed=2, vocab_size=1000, cutoffs=[100, 500])
    pool = txl.BlockPool(model.memory_layout(), block_size=4, blocks=64)
    graphs = graphs_over(model, pool, max_batch_size=2, max_positions=16, capture=False)
    (row,) = decode_rows(model, pool, [5], mem_len=16)
    assert graphs.supports([row])
    assert not graphs.supports([DecodeRow(row.memory, row.last_hidden, SamplingParams(top_k=600), 1, 0)])


def test_buffers_that_cannot_be_remade_after_the_pool_grew_turn_off_and_the_step_runs_eagerly(caplog):
    model = tiny_model(seed=41, mem_len=24)
    pool = txl.BlockPool(model.memory_layout(), block_size=4, blocks=12)  # grows on the next step
    graphs = graphs_over(model, pool, max_batch_size=4, max_positions=24, capture=False)
    graphs.capture_all()
    built_on = pool.generation
    rows = decode_rows(model, pool, [8, 8, 8, 8])  # full blocks: every row needs a new one
    expected, _ = ModelRunner(model, pool).run(rows, [])

    def failing(*key):
        raise MemoryError("out of memory")

    graphs._build = failing  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        got = graphs.run(rows)
    assert pool.generation > built_on and graphs.off is not None and "out of memory" in graphs.off
    assert [o.token for o in got] == [o.token for o in expected]
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.last_hidden, b.last_hidden, rtol=0, atol=1e-5)
    assert not graphs.supports(rows)


async def test_a_cpu_server_chooses_its_linear_kernels_before_it_is_ready(make_settings):
    """Kernels are chosen by timing the first time a row count meets a layer: start-up meets every measured
    row count, so no user's request pays for the measurement."""
    from txl.kernels.cpu.linear import chosen_kernels
    from txl.kernels.cpu.linear_choice import ROW_BUCKETS

    async with running(make_settings()) as rt:
        chosen = chosen_kernels(rt.worker.model)
        threads = torch.get_num_threads()
        for rows in ROW_BUCKETS:
            assert any(key.endswith(f"rows={rows} threads={threads}") for key in chosen), (rows, chosen)
