"""Run as a separate process with TRITON_INTERPRET=1 (Triton reads it when it is imported); prints one JSON line.

    python -m tests.model.loads_interpreted rows_linear   # the row linears' LayerNorm at 16 and 64 rows
    python -m tests.model.loads_interpreted nucleus       # top-p's pass, its last program's reads of the chunks

How long a kernel's slowest program takes on a GPU is, for these memory-bound kernels, its count of loads that
follow one another: the program that arrives last and finishes a row (`triton_common` semaphores) cannot start
before the others end, and each of its loads is a round trip to L2. Triton's interpreter runs every program in
turn; counting the loads each issues (one per `tl.load`, whatever its width) finds the longest such tail. Each
command reports, per launch of its calls, the most loads a program issued and the grid's size.

`rows_linear` also checks that a row's LayerNorm gives the same bits whichever program normalises it: products
of small integers are exact in any order, so a row alone, in a batch that the product's last tile normalises, and
in batches that take the LayerNorm's own launch (a graph's padded bucket included) must agree bit for bit.
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Callable

import torch
from triton.runtime import interpreter
from txl.kernels.triton import rows_linear as triton_rows_linear
from txl.kernels.triton import sampling as triton_sampling
from txl.kernels.triton.rows_linear import RowsPlan


def loads_per_launch(call: Callable[[], object]) -> list[dict[str, int]]:
    """Runs `call`; for each kernel launch in it, the most loads one program issued and the programs launched."""
    launches: list[collections.Counter[tuple[int, int, int]]] = []
    builder = interpreter.InterpreterBuilder
    set_grid_dim, masked_load = builder.set_grid_dim, builder.create_masked_load

    def on_launch(self, *grid):
        launches.append(collections.Counter())
        return set_grid_dim(self, *grid)

    def on_load(self, *args, **kwargs):
        launches[-1][self.grid_idx] += 1
        return masked_load(self, *args, **kwargs)

    builder.set_grid_dim, builder.create_masked_load = on_launch, on_load
    try:
        call()
    finally:
        builder.set_grid_dim, builder.create_masked_load = set_grid_dim, masked_load
    return [{"most": max(c.values(), default=0), "programs": len(c)} for c in launches]


def rows_linear() -> dict[str, object]:
    generator = torch.Generator().manual_seed(3)
    inputs, outputs = 512, 256
    # Small integers: every product and sum of products is exact, in any order.
    x = torch.randint(-3, 4, (64, inputs), generator=generator).float()
    w = torch.randint(-2, 3, (outputs, inputs), generator=generator).float()
    bias, gain, shift = (torch.randn(outputs, generator=generator) for _ in range(3))
    residual = torch.randn(64, outputs, generator=generator)
    tails = {}
    for rows in (16, 64):
        block_m = 16 if rows <= 16 else 64
        plan = RowsPlan(block_m, 32, 32, 16, inputs // 16)  # 16 splits, as wt103's at any batch

        def call(rows=rows, plan=plan):
            triton_rows_linear.rows_linear(
                x[:rows], w, bias, residual=residual[:rows], norm=(gain, shift, 1e-5), plan=plan
            )

        tails[rows] = loads_per_launch(call)
    same = {}
    for dtype in (torch.float32, torch.bfloat16):
        results = {}
        for rows in (
            1,
            5,
            40,
            64,
        ):  # alone, the last tile's LayerNorm, the LayerNorm's launch, a padded bucket
            results[rows] = triton_rows_linear.rows_linear(
                x[:rows].to(dtype),
                w.to(dtype),
                bias.to(dtype),
                residual=residual[:rows].to(dtype),
                norm=(gain.to(dtype), shift.to(dtype), 1e-5),
            )
        same[str(dtype).removeprefix("torch.")] = all(
            torch.equal(results[rows][:1], results[1]) for rows in (5, 40, 64)
        ) and torch.equal(results[40], results[64][:40])
    return {"tails": tails, "same_bits": same}


def nucleus() -> dict[str, object]:
    """One top-p search over rows of 40 chunks (of 1,024 words: a compile-time constant of the kernels)."""
    triton_sampling.CHUNK = 1024
    log_probs = torch.log_softmax(
        torch.randn(2, 40 * 1024, generator=torch.Generator().manual_seed(1)), dim=-1
    )

    def call():
        triton_sampling.nucleus_thresholds(log_probs, torch.ones(2), torch.full((2,), 0.9))

    launches = loads_per_launch(call)
    return {"row_max": launches[0], "passes": launches[1:], "chunks": 40}


def main() -> None:
    result = rows_linear() if sys.argv[1] == "rows_linear" else nucleus()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
