"""Decoding through a CUDA graph's static buffers against the eager runner, on one decode path.

Imported by test_graphs.py, and run as a process of its own with TRITON_INTERPRET=1 for the Triton kernels (Triton
reads the switch when it is imported): `python -m tests.server.engine.graph_cases triton` prints the largest difference.
"""

from __future__ import annotations

import dataclasses
import sys

import torch
import txl
from txl.kernels import REFERENCE, DecodePath
from txl.sampling import SamplingParams
from txl_server.engine.graphs import DecodeGraphs
from txl_server.engine.rows import DecodeRow
from txl_server.engine.runner import ModelRunner

from tests.helpers.tiny_models import tiny_model

PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.1, top_k=5, seed=2),
    SamplingParams(top_p=0.6, seed=3),
    SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
]
MEM_LEN, GRID = 24, 8


def decode_rows(model, pool, lengths, *, grid=None, mem_len=MEM_LEN):
    """One decoding row per length: a memory fed that many random tokens, with the hidden state it predicts from."""
    generator = torch.Generator().manual_seed(5)
    rows = []
    with torch.inference_mode():
        for i, n in enumerate(lengths):
            memory = model.empty_memory(1, mem_len=mem_len, pool=pool, grid=grid)
            tokens = torch.randint(0, 64, (1, n), generator=generator).to(model.device)
            hidden, memory = model(tokens, memory)
            rows.append(DecodeRow(memory, hidden[0, -1].clone(), PARAMS[i % len(PARAMS)], 100 + i, i))
    return rows


def max_positions(model, grid):
    return txl.WindowRule(MEM_LEN, model.config.same_length, grid).max_positions


def graphs_over(model, pool, *, max_batch_size, max_positions, capture=False, path: DecodePath = REFERENCE):
    """Decoding graphs over `pool` on `path` (captured, or their static buffers run eagerly), with an eager runner
    of the same pool and path as their fallback (as a worker makes)."""
    path = dataclasses.replace(path, graphs="cuda" if capture else "static")
    eager = ModelRunner(model, pool, path).decode
    return DecodeGraphs(
        model, pool, path, eager=eager, max_batch_size=max_batch_size, max_positions=max_positions
    )


def compare(
    device: str = "cpu",
    *,
    capture: bool = False,
    same_length: bool = True,
    grid=None,
    path: DecodePath = REFERENCE,
) -> float:
    """Runs batches of rows (several buckets, padding rows in some) and two more steps from each, through the
    graphs and eagerly on `path`; asserts equal tokens and memory lengths, returns the largest hidden-state
    difference."""
    model = tiny_model(seed=41, mem_len=MEM_LEN, same_length=same_length).to(device)
    pool = txl.BlockPool(model.memory_layout(), block_size=4)
    graphs = graphs_over(
        model, pool, max_batch_size=8, max_positions=max_positions(model, grid), capture=capture, path=path
    )
    if capture:  # captured graphs are made up front, never while running
        graphs.capture_all()
    eager = ModelRunner(model, pool, path)
    worst = 0.0
    for lengths in ([1, 7, 30], [2, 3, 5, 8, 13, 21], [24]):  # buckets 4, 8 and 1: padding rows in two
        rows = decode_rows(model, pool, lengths, grid=grid)
        for _ in range(3):  # the memories the graph path returns continue like the eager ones
            assert graphs.supports(rows)
            got = graphs.run(rows)
            expected, _ = eager.run(rows, [])
            assert [o.token for o in got] == [o.token for o in expected]
            for a, b in zip(got, expected, strict=True):
                assert abs(a.logprob - b.logprob) < 1e-5
                assert a.memory.length == b.memory.length and a.memory.fed == b.memory.fed
                worst = max(worst, float((a.last_hidden - b.last_hidden).abs().max()))
            rows = [
                DecodeRow(o.memory, o.last_hidden, r.params, r.seed, r.counter + 1)
                for o, r in zip(got, rows, strict=True)
            ]
    return worst


# The paths by the name a test gives: torch's, the C kernels, Triton's.
PATHS = {"torch": REFERENCE, "c": DecodePath.c(), "triton": DecodePath.triton()}


def main() -> None:
    path = PATHS[sys.argv[1]]
    worst = 0.0
    for same_length, grid in ((True, None), (False, GRID)):
        worst = max(worst, compare(same_length=same_length, grid=grid, path=path))
    print(worst)


if __name__ == "__main__":
    main()
