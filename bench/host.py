"""The host's share of a decoding iteration through the graphs, counted and timed on a CPU.

On a GPU a captured iteration is one replay; what the host does around it (planning rows, sending their inputs,
reading the sampled ids back, cutting the outputs per row) is time the device waits for, and every copy from
pageable memory or read of a device value makes the host wait for the device in turn. Both can be seen without a
GPU: the operations are counted on the `meta` device (tests/server/dispatch_counts.py: launches, host-to-device
copies, synchronisations, by phase), and the host time is measured on the CPU with the body's own time taken
out. "As it was" replays, in the same run, the host side this replaced: sampling parameters sent as six tensors
from Python lists (each a blocking copy), padding parameters rebuilt every iteration, a zero fill per block
allocation, a copy per row of the hidden states after the replay.
"""

from __future__ import annotations

import statistics
import time

import torch
import txl
from txl.paged import plan_row
from txl.sampling import RowParams, SamplingParams
from txl_server.engine.graphs import DecodeGraphs
from txl_server.engine.runner import DecodeRow

from tests.model.helpers import tiny_model
from tests.server.dispatch_counts import one_iteration

from .common import Section

MEM = 64
STEPS = 60


def _rows(model, pool, batch):
    rows = []
    with torch.inference_mode():
        for i in range(batch):
            memory = model.empty_memory(1, mem_len=MEM, pool=pool, grid=8)
            hidden, memory = model(torch.randint(0, 64, (1, 40 + i % 16)), memory)
            params = SamplingParams(temperature=0.8, top_p=0.95, seed=i)
            rows.append(DecodeRow(memory, hidden[0, -1].clone(), params, i, 0))
    return rows


def _as_it_was(graphs: DecodeGraphs, rows: list[DecodeRow]) -> list[DecodeRow]:
    """The host side of an iteration before staging (same work, the old way), around the real replay."""
    pool, vocab, device = graphs.pool, graphs.vocab, graphs.pool.layout.device
    steps = [
        plan_row(pool, r.memory.rows[0], 1, r.memory.rule(False).keep(r.memory.rows[0].fed + 1)) for r in rows
    ]
    key = graphs.key(rows)
    assert key is not None
    graph = graphs._graphs[key]
    graph.step.load(steps, [r.memory.rule(False) for r in rows])
    for _ in range(5):  # the old load sent the step's inputs as one tensor, then copied it into five buffers
        graph.step.write_blocks.clone()
    n, size = len(rows), key[0]
    graph.hidden_in[:n].copy_(torch.stack([r.last_hidden for r in rows]))
    graph.hidden_in[n:].zero_()
    fresh = RowParams.build(
        [r.params for r in rows], [r.seed for r in rows], [r.counter for r in rows], vocab, device
    )
    padding = RowParams.build(
        [SamplingParams(temperature=0)] * (size - n), [0] * (size - n), [0] * (size - n), vocab, device
    )
    for name in ("temperature", "greedy", "top_k", "top_p", "seeds", "counters"):
        getattr(fresh, name).clone()
        getattr(padding, name).clone()
    graph.replay()
    host = torch.cat([graph.readback[:n, 0].clone(), graph.readback[:n, 1].clone()]).cpu()
    ids = host[:n].long().tolist()
    return [
        DecodeRow(r.memory.like([rs.result]), graph.hidden_out[i].clone(), r.params, r.seed, r.counter + 1)
        for i, (r, rs, _) in enumerate(zip(rows, steps, ids, strict=True))
    ]


def _now(graphs: DecodeGraphs, rows: list[DecodeRow]) -> list[DecodeRow]:
    out = graphs.run(rows)
    return [
        DecodeRow(o.memory, o.last_hidden, r.params, r.seed, r.counter + 1)
        for o, r in zip(out, rows, strict=True)
    ]


def host_ms(batch: int, step) -> float:
    """Median host milliseconds per iteration outside the replayed body."""
    model = tiny_model(seed=1, mem_len=MEM)
    pool = txl.BlockPool(model.memory_layout(), block_size=16, blocks=batch * 12 + 64, growable=False)
    graphs = DecodeGraphs(model, pool, max_batch_size=batch, max_positions=MEM + 7, capture=False)
    rows = _rows(model, pool, batch)
    graphs.capture_all()
    body: list[float] = []
    for graph in graphs._graphs.values():
        inner = graph.replay

        def timed(inner=inner) -> None:
            started = time.perf_counter()
            inner()
            body.append(time.perf_counter() - started)

        graph.replay = timed
    totals = []
    with torch.inference_mode():
        for _ in range(STEPS):
            started = time.perf_counter()
            rows = step(graphs, rows)
            totals.append(time.perf_counter() - started)
    skip = STEPS // 6
    return (statistics.median(totals[skip:]) - statistics.median(body[skip:])) * 1e3


def run(quick: bool = False) -> Section:
    torch.set_num_threads(1)
    section = Section(
        "host", "The host around a decoding graph: counted, and timed on a CPU", "python -m bench host"
    )
    section.note(__doc__.split("\n\n", 1)[1].strip())
    rows = []
    for batch in (1, 8, 64):
        counts = one_iteration(batch)
        outside = counts["before"] + counts["after"]
        was, now = host_ms(batch, _as_it_was), host_ms(batch, _now)
        rows.append(
            [
                batch,
                outside["launch"],
                outside["h2d"],
                outside["sync"],
                counts["body"]["sync"],
                f"{was:.2f}",
                f"{now:.2f}",
                f"{was / now:.1f}x",
            ]
        )
    section.table(
        "One decoding iteration of the tiny test model through DecodeGraphs.run",
        [
            "rows",
            "launches outside the graph",
            "host-to-device copies",
            "waits for the device",
            "waits inside the graph",
            "host ms as it was",
            "host ms now",
            "lower by",
        ],
        rows,
    )
    section.note(
        "Counted on the meta device (a copy from pageable memory or a read of a device value counts as a wait); "
        "timed with 1 thread, tiny model, memory 64, 60 iterations (median, first sixth dropped)."
    )
    return section
