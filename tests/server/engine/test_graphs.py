"""Decoding iterations through the static buffers a CUDA graph captures give what the eager runner gives, on every
decode path, and a graph never reads a tensor that was reallocated or freed behind it.

On a CPU the buffers run eagerly (no capture): the same inputs, padding rows and sampling, the same body a CUDA
graph records (what the body reads is recorded with a dispatch mode); on a CUDA device the iteration is
captured and replayed (those tests are skipped elsewhere)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import txl
from torch.utils._python_dispatch import TorchDispatchMode
from txl.kernels.cpu.paged_decode import cpu_paged_decode
from txl.kernels.triton import decode as triton_kernel
from txl.paged import decode_plan
from txl.paged.decode_plan import DecodePlan
from txl.paged.rows import plan_row
from txl.sampling import SamplingParams
from txl_server.engine import graphs as graphs_module
from txl_server.engine.graphs import DecodeGraphs, buckets
from txl_server.engine.rows import release_outputs
from txl_server.engine.runner import ModelRunner
from txl_server.runtime import Runtime

from tests.helpers.interpreted import run_interpreted
from tests.helpers.tiny_models import tiny_model

from .graph_cases import GRID, MEM_LEN, PATHS, compare, decode_rows, graphs_over, max_positions

KERNELS = [
    "torch",
    pytest.param(
        "c", marks=pytest.mark.skipif(cpu_paged_decode() is None, reason="no C compiler for the C kernels")
    ),
]


def test_buckets_cover_every_batch_size():
    assert buckets(1) == [1]
    assert buckets(48) == [1, 2, 4, 8, 16, 32, 48]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("same_length", [True, False], ids=["same_length", "grid"])
def test_static_decode_buffers_give_the_eager_results(kernel, same_length):
    """The torch path derives its masks and indices inside the body from each iteration's buffers (computed
    once from the warm-up's padding rows, every replay attended to the scratch block only: off by 5.0)."""
    worst = compare(same_length=same_length, grid=None if same_length else GRID, path=PATHS[kernel])
    assert worst < 1e-5


@pytest.mark.skipif(triton_kernel.triton is None, reason="triton is not installed")
def test_static_decode_buffers_with_the_triton_kernel_give_the_eager_results():
    """The Triton kernel under its interpreter (a process of its own: Triton reads the switch when imported)."""
    done = run_interpreted("tests.server.engine.graph_cases", "triton", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_decode_graphs_give_the_eager_results():
    assert compare("cuda", capture=True) < 1e-4
    assert compare("cuda", capture=True, same_length=False, grid=GRID) < 1e-4


class _Reads(TorchDispatchMode):
    """The storages an operation reads or writes that were not made during the recording: what a captured
    graph holds the addresses of."""

    def __init__(self) -> None:
        super().__init__()
        self.made: set[int] = set()
        self.outside: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def visit(value, into):
            if isinstance(value, torch.Tensor) and value.layout == torch.strided:
                into(value.untyped_storage().data_ptr())
            elif isinstance(value, (list, tuple)):
                for item in value:
                    visit(item, into)

        def read(pointer: int) -> None:
            if pointer not in self.made:
                self.outside.add(pointer)

        visit(list(args) + list((kwargs or {}).values()), read)
        out = func(*args, **(kwargs or {}))
        visit(out, self.made.add)
        return out


def _reads(replay) -> set[int]:
    with torch.inference_mode(), _Reads() as reads:
        replay()
    return reads.outside


def test_a_graph_keeps_reading_what_it_captured_after_an_eager_step_grows_the_positional_table():
    """An eager step longer than any before makes the model build a longer positional table (new tensors); a
    graph that read the model's table at each replay would then read freed memory on a GPU."""
    model = tiny_model(seed=41, mem_len=MEM_LEN, same_length=False)
    pool = txl.BlockPool(model.memory_layout(), block_size=4, blocks=256, growable=False)
    graphs = graphs_over(
        model, pool, max_batch_size=2, max_positions=max_positions(model, GRID), capture=False
    )
    rows = decode_rows(model, pool, [5, 30], grid=GRID)
    graphs.run(rows)
    (graph,) = graphs._graphs.values()
    before = _reads(graph.replay)
    tables = model.transformer.positional_tables(1)
    # A long append to a full memory: the table grows past what the graph was built for.
    with torch.inference_mode():
        model(torch.zeros((1, 3 * graphs.n_pos), dtype=torch.long), rows[1].memory)
    assert model.transformer.positional_tables(1)[0].data_ptr() != tables[0].data_ptr()
    graphs.run(rows)
    assert _reads(graph.replay) == before


def test_a_pool_that_grows_while_rows_are_planned_is_never_replayed_stale(monkeypatch):
    """A growable pool (CPU) reallocates its tensors when a step's new blocks do not fit: the graph that runs
    the step must be one built on the reallocated tensors. The graphs are built before the rows are planned (as
    at start-up), so that a graph looked up before planning would be one built on the old tensors."""
    replays = []
    build = DecodeGraphs._build

    def recording_build(self, *key):
        graph = build(self, *key)
        born, inner = self.pool.generation, graph.replay

        def replay():
            replays.append((born, self.pool.generation))
            inner()

        graph.replay = replay
        return graph

    monkeypatch.setattr(graphs_module.DecodeGraphs, "_build", recording_build)
    model = tiny_model(seed=41, mem_len=MEM_LEN)
    # 11 usable blocks each; the reference runs in a pool of its own, so that this one grows only in the plan.
    pool, reference = (txl.BlockPool(model.memory_layout(), block_size=4, blocks=12) for _ in range(2))
    graphs = graphs_over(model, pool, max_batch_size=4, max_positions=MEM_LEN, capture=False)
    rows = decode_rows(model, pool, [8, 8, 8, 8])  # 2 full blocks each: every row needs a new block
    expected, _ = ModelRunner(model, reference).run(decode_rows(model, reference, [8, 8, 8, 8]), [])
    graphs.capture_all()
    assert pool.generation == 0 and pool.capacity - pool.used_blocks < 4
    got = graphs.run(rows)
    assert pool.generation > 0 and replays and all(born == now for born, now in replays)
    assert [o.token for o in got] == [o.token for o in expected]


@pytest.mark.parametrize("few_rows", [0, 1000])  # rows planned through arrays, and one by one
def test_what_an_iteration_leaves_in_the_buffers_never_reaches_the_next(few_rows, monkeypatch):
    """An iteration reuses what the one before left where it still holds (the padding rows, the sampling
    parameters, the rows' hidden states when they come back in the same order): rows in another order, fewer or
    more rows, other parameters, and two rows continuing one memory decode what the eager runner does in a pool
    of its own."""
    monkeypatch.setattr(decode_plan, "FEW_ROWS", few_rows)
    model = tiny_model(seed=41, mem_len=MEM_LEN)
    pools = [txl.BlockPool(model.memory_layout(), block_size=4) for _ in range(2)]
    graphs = graphs_over(
        model, pools[0], max_batch_size=8, max_positions=max_positions(model, None), capture=False
    )
    eager = ModelRunner(model, pools[1])
    lengths = [3, 9, 16, 22, 30, 5]
    both = [decode_rows(model, pool, lengths) for pool in pools]  # the same rows in each pool

    def step(both, pick=slice(None), params=None):
        both = [
            [rows[i] for i in range(len(rows))[pick]] if isinstance(pick, slice) else pick(rows)
            for rows in both
        ]
        if params is not None:
            both = [
                [dataclasses.replace(r, params=p) for r, p in zip(rows, params, strict=True)] for rows in both
            ]
        got, (expected, _) = graphs.run(both[0]), eager.run(both[1], [])
        assert [o.token for o in got] == [o.token for o in expected]
        for a, b in zip(got, expected, strict=True):
            assert abs(a.logprob - b.logprob) < 1e-5 and a.memory.fed == b.memory.fed
            torch.testing.assert_close(a.last_hidden, b.last_hidden, rtol=0, atol=1e-5)
        return [
            [
                dataclasses.replace(r, memory=o.memory, last_hidden=o.last_hidden, counter=r.counter + 1)
                for o, r in zip(outs, rows, strict=True)
            ]
            for outs, rows in ((got, both[0]), (expected, both[1]))
        ]

    both = step(step(both))  # the same rows twice: buffers reused as they are
    both = step(both, slice(None, None, -1))  # another order
    both = step(both, slice(0, 5))  # fewer, in the same graph: more padding
    both = step(both, lambda rows: rows + rows[:2])  # more; two continue one memory (in place, and a copy)
    params = [SamplingParams(temperature=0.5 + i / 10, top_k=3 + i, seed=i) for i in range(7)]
    both = step(both, params=params)
    both = step(both, slice(0, 3))  # fewer: another graph
    step(both, lambda rows: rows + rows)


def test_rows_longer_than_the_buffers_run_eagerly():
    """A memory longer than the graphs were built for (restored after the server's largest mem_len was
    lowered) is not loaded into the buffers, whose positional scores it would read beyond; it runs eagerly."""
    model = tiny_model(seed=3, mem_len=20)
    pool = txl.BlockPool(model.memory_layout(), block_size=4, blocks=128)
    graphs = graphs_over(model, pool, max_batch_size=2, max_positions=16, capture=False)
    runner = ModelRunner(model, pool, graphs.path, graphs)
    (row,) = decode_rows(model, pool, [20], mem_len=20)
    assert row.memory.length == 20 and not graphs.supports([row])
    got, _ = runner.run([row], [])
    expected, _ = ModelRunner(model, pool).run([row], [])
    torch.testing.assert_close(got[0].last_hidden, expected[0].last_hidden, rtol=0, atol=1e-6)
    plan = DecodePlan.of_row_steps([plan_row(pool, row.memory.rows[0], 1, 20)])
    graph = graphs._build(1, 0, False)
    with pytest.raises(ValueError, match="longer than the step was built for"):
        graph.step.load(plan, np.array([row.memory.rule(False).window(20)]))


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


def test_a_batch_going_on_is_not_read_back_row_by_row_and_keeps_no_finished_row_alive(monkeypatch):
    """Rows that continue as the last iteration left them, in its order, are planned from the numbers it left
    (txl.paged.decode_plan's `previous`); rows in another order, or other rows, are read back. What the graphs keep of
    the last iteration holds no blocks: once its rows are dropped, the pool has them back."""
    monkeypatch.setattr(decode_plan, "FEW_ROWS", 0)
    carried: list[bool] = []
    plan = graphs_module.plan_decode

    def spy(pool, rows, keeps, previous=None):
        carried.append(previous is not None)
        return plan(pool, rows, keeps, previous)

    monkeypatch.setattr(graphs_module, "plan_decode", spy)
    model = tiny_model(seed=41, mem_len=MEM_LEN)
    pool = txl.BlockPool(model.memory_layout(), block_size=4)
    graphs = graphs_over(
        model, pool, max_batch_size=8, max_positions=max_positions(model, None), capture=False
    )
    eager = ModelRunner(model, pool)
    scratch = pool.used_blocks  # the graphs' padding block
    rows = decode_rows(model, pool, [3, 9, 16, 22, 30, 5])

    def go_on(rows, outs):
        return [
            dataclasses.replace(r, memory=o.memory, last_hidden=o.last_hidden) for o, r in zip(outs, rows)
        ]

    for order in (None, None, None, "reversed", None, "fewer", None):
        if order == "reversed":
            rows = rows[::-1]
        elif order == "fewer":
            rows, (finished, *_) = rows[1:], rows
            finished.memory.release()  # a row that ends: its holder releases it
        got, (expected, _) = graphs.run(rows), eager.run(rows, [])
        assert [o.token for o in got] == [o.token for o in expected]
        release_outputs(expected)
        for row in rows:  # the rows' memories before the step, as a task releases them
            row.memory.release()
        rows = go_on(rows, got)
    assert carried == [False, True, True, False, True, False, True]
    for row in rows:
        row.memory.release()
    assert graphs._last_rows is not None  # it still has the numbers, and no hold on the blocks
    assert pool.used_blocks == scratch and pool.live_tables == 1
