"""The host's share of a decoding iteration through the graphs, counted and timed on a CPU.

On a GPU a captured iteration is one replay; what the host does around it (planning rows, sending their inputs,
reading the sampled ids back, cutting the outputs per row) is time the device waits for, and every copy from
pageable memory or read of a device value makes the host wait for the device in turn. Both can be seen without a
GPU: the operations are counted on the `meta` device (tests/server/engine/dispatch_counts.py: launches, host-to-device
copies, synchronisations, by phase), and the host time is measured on the CPU as the review that found them
measured it (`../shared/gpu_review/host_overhead.py`): an iteration's time through `DecodeGraphs.run`, less the
replayed body's own, on the tiny test model. "Before" is the tree at `BEFORE`, exported from git and timed in
the same run, in turns with this one (each a process of its own, best of the rounds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from txl_server.check.benchmark_docs import Section

from tests.server.engine.dispatch_counts import one_iteration

from .common import ROOT, export_revision

BEFORE = (
    "1ffa65d"  # the code the review counted: six blocking copies a step, padding rebuilt, a clone per row
)
BATCHES = (1, 8, 64)
ROUNDS = 3
STEPS = 80  # the first 10 dropped, the median of the rest

# Runs in a process of its own, on either tree: their DecodeGraphs differ in how the positional table is sized
# (max_mem_len before, max_positions since), whether they are given their eager path (`eager`, where the rows are
# a module of their own) and their decode path (now: the fastest on this CPU, which the tree before took by
# default).
_PROBE = """
import dataclasses, json, statistics, sys, time
import torch, txl
from txl.sampling import SamplingParams
from txl_server.engine import graphs as G
from txl_server.engine.runner import ModelRunner
try:
    from txl_server.engine.rows import DecodeRow
except ImportError:  # a tree before
    from txl_server.engine.runner import DecodeRow
try:
    from tests.helpers.tiny_models import tiny_model
except ImportError:  # a tree before the test helpers had one home
    from tests.model.helpers import tiny_model

torch.set_num_threads(1)
MEM, STEPS = 64, {steps}


def host_ms(batch):
    model = tiny_model(seed=1, mem_len=MEM)
    pool = txl.BlockPool(model.memory_layout(), block_size=16, blocks=batch * 12 + 64, growable=False)
    if hasattr(txl, "fastest"):  # this tree: the graphs and their eager path on a decode path
        path = dataclasses.replace(txl.fastest("cpu"), graphs="static")
        eager = ModelRunner(model, pool, path).decode
        graphs = G.DecodeGraphs(model, pool, path, eager=eager, max_batch_size=64, max_positions=MEM + 7)
    else:
        given = dict(max_batch_size=64, capture=False)
        if hasattr(ModelRunner, "decode"):  # a tree where the graphs are given their eager path
            given["eager"] = ModelRunner(model, pool).decode
        try:
            graphs = G.DecodeGraphs(model, pool, max_positions=MEM + 7, **given)
        except TypeError:  # the tree before: the table sized by the memory alone
            graphs = G.DecodeGraphs(model, pool, max_mem_len=MEM, **given)
    rows = []
    with torch.inference_mode():
        for i in range(batch):
            memory = model.empty_memory(1, mem_len=MEM, pool=pool)
            hidden, memory = model(torch.randint(0, 64, (1, 40 + i % 16)), memory)
            params = SamplingParams(temperature=0.8, top_p=0.95)
            rows.append(DecodeRow(memory, hidden[0, -1].clone(), params, i, 0))
    graphs.run(rows)
    graph = next(iter(graphs._graphs.values()))
    replay, body, totals = graph.replay, [], []

    def timed():
        started = time.perf_counter()
        replay()
        body.append(time.perf_counter() - started)

    graph.replay = timed
    for _ in range(STEPS):
        started = time.perf_counter()
        out = graphs.run(rows)
        totals.append(time.perf_counter() - started)
        rows = [DecodeRow(o.memory, o.last_hidden, r.params, r.seed, r.counter + 1) for o, r in zip(out, rows)]
    return (statistics.median(totals[10:]) - statistics.median(body[10:])) * 1e3


print(json.dumps({{batch: host_ms(batch) for batch in {batches}}}))
"""


def probe(tree: Path, *, steps: int = STEPS, batches: tuple[int, ...] = BATCHES) -> dict[int, float]:
    """Host ms per iteration for each batch size, measured by the code in `tree`."""
    path = os.pathsep.join(str(p) for p in (tree / "model", tree / "server", tree))
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(steps=steps, batches=batches)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the host probe failed in {tree}:\n{done.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def run(quick: bool = False) -> Section:
    section = Section(
        "host", "The host around a decoding graph: counted, and timed on a CPU", "python -m bench host"
    )
    section.note(__doc__.split("\n\n", 1)[1].strip())
    before: dict[int, float] = {}
    now: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="txl-host-") as tmp:
        old_tree = export_revision(BEFORE, Path(tmp) / "before")
        for _ in range(1 if quick else ROUNDS):
            for tree, best in ((old_tree, before), (ROOT, now)):
                for batch, ms in probe(tree).items():
                    best[batch] = min(best.get(batch, float("inf")), ms)
    rows = []
    for batch in BATCHES:
        counts = one_iteration(batch)
        outside = counts["before"] + counts["after"]
        rows.append(
            [
                batch,
                outside["launch"],
                outside["h2d"],
                outside["sync"],
                counts["body"]["sync"],
                f"{before[batch]:.2f}",
                f"{now[batch]:.2f}",
                f"{before[batch] / now[batch]:.1f}x",
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
            f"host ms at {BEFORE}",
            "host ms now",
            "lower by",
        ],
        rows,
    )
    section.note(
        "Counted on the meta device (a copy from pageable memory or a read of a device value counts as a wait). "
        f"The review counted, at {BEFORE} and 64 rows, 28 waits and 107 launches outside the graph. Timed with 1 "
        f"thread, tiny model, memory 64, {STEPS} iterations (median of the last {STEPS - 10}), best of "
        f"{1 if quick else ROUNDS} rounds per tree. On a CPU a host-to-device copy is a memcpy and a wait costs "
        "nothing, so the time saved here is the host's Python and small ops only; on a GPU each wait removed also "
        "stops the host from idling behind the device, and the overlapped loop (TXL_OVERLAP) hides what is left "
        "behind the next replay."
    )
    return section
