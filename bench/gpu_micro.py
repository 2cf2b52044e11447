"""The fused decoding body's own kernels, one at a time, at wt103's shapes in bfloat16 (d_model 1,024, 16 heads of
64, d_inner 4,096, memory 1,600): the row linears with their LayerNorm at 1, 16 and 64 rows (the attention's
output projection, 1,024 x 1,024; the feed-forward's output, 1,024 x 4,096, with its bias and the ReLU on its
input) and the fused attention at 1 and 64 rows. Each is timed as a decoding graph runs it (a CUDA graph of
repeated launches, `triton.testing.do_bench_cudagraph`) and set against its floor: the bytes it must read (the
weight, or the rows' keys and values and the positional keys) and write, over the copy bandwidth measured in the
same run. `bench gpu` runs these first (scripts/gpu-check.sh: its first step), so that the review's estimate
(docs/benchmarks.md, "The wt103 step on an H200, estimated") meets a measurement even when something later fails.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from txl.kernels.decode_rows import GivenRows
from txl.kernels.triton.attention import decode_attention, tile_and_warps
from txl.kernels.triton.decode import LaunchPlan
from txl.kernels.triton.rows_linear import rows_linear

WT103 = dict(d_model=1024, heads=16, d_head=64, d_inner=4096, mem=1600, block_size=16)
LINEAR_ROWS = (1, 16, 64)
ATTENTION_ROWS = (1, 64)

Timer = Callable[[Callable[[], object]], float]  # seconds a call takes


@dataclass(frozen=True)
class Case:
    label: str
    rows: int
    call: Callable[[], object]
    moved: int  # bytes the call must read and write


def cuda_graph_timer(call: Callable[[], object]) -> float:
    """Seconds per call, replayed in a CUDA graph (what a decoding graph pays: no launch from the host)."""
    import triton.testing

    call()  # compiled and warm before the capture
    return triton.testing.do_bench_cudagraph(call, rep=100) / 1e3


def linear_cases(device: torch.device, dtype: torch.dtype, shape: dict[str, int] = WT103) -> list[Case]:
    d, inner = shape["d_model"], shape["d_inner"]
    width = shape["heads"] * shape["d_head"]
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, generator=generator, device=device) * scale).to(dtype)

    out_proj, ff_out = randn(d, width, scale=width**-0.5), randn(d, inner, scale=inner**-0.5)
    bias, lift, gain, shift = randn(d), randn(inner), randn(d), randn(d)
    size = torch.empty((), dtype=dtype).element_size()
    cases = []
    for rows in LINEAR_ROWS:
        attended, hidden, residual = randn(rows, width), randn(rows, inner), randn(rows, d)
        cases.append(
            Case(
                f"output projection + LayerNorm ({d:,} x {width:,})",
                rows,
                functools.partial(
                    rows_linear, attended, out_proj, residual=residual, norm=(gain, shift, 1e-5)
                ),
                (d * width + rows * (width + 2 * d)) * size,
            )
        )
        cases.append(
            Case(
                f"feed-forward output + LayerNorm ({d:,} x {inner:,})",
                rows,
                functools.partial(
                    rows_linear,
                    hidden,
                    ff_out,
                    bias,
                    relu_input=lift,
                    residual=residual,
                    norm=(gain, shift, 1e-5),
                ),
                (d * inner + rows * (inner + 2 * d)) * size,
            )
        )
    return cases


def attention_cases(device: torch.device, dtype: torch.dtype, shape: dict[str, int] = WT103) -> list[Case]:
    heads, d_head, mem, block = shape["heads"], shape["d_head"], shape["mem"], shape["block_size"]
    width = -(-(mem + 1) // block)  # a row's blocks
    size = torch.empty((), dtype=dtype).element_size()
    generator = torch.Generator(device=device).manual_seed(1)
    cases = []
    for rows in ATTENTION_ROWS:
        keys = torch.randn((heads, rows * width + 1, block, d_head), generator=generator, device=device).to(
            dtype
        )
        values = torch.randn_like(keys)
        table = torch.arange(rows * width, device=device).view(rows, width) + 1  # block 0 unused
        every = torch.full((rows,), mem + 1, dtype=torch.long, device=device)
        given = GivenRows(table, torch.zeros_like(every), every, every)
        p = torch.full((rows,), mem, dtype=torch.long, device=device)
        qkv = torch.randn((rows, 3 * heads * d_head), generator=generator, device=device).to(dtype)
        u, v = torch.randn((2, heads, d_head), generator=generator, device=device).to(dtype)
        positions = torch.randn((heads, mem + 1, d_head), generator=generator, device=device).to(dtype)
        blocks, slots = table[torch.arange(rows, device=device), p // block], p % block

        call = functools.partial(
            decode_attention, qkv, u, v, positions, keys, values, given, blocks, slots,
            scale=d_head**-0.5, n_pos=mem + 1,
        )  # fmt: skip
        moved = (rows * 2 + 1) * heads * (mem + 1) * d_head * size  # keys and values, the positional keys
        cases.append(Case(f"fused attention (memory {mem:,})", rows, call, moved))
        # Partitions of other sizes (the default: PARTITION_TILES): one tile, and four (before): what fewer keys a
        # program gain at 1 row and cost at 64 (more partitions' sums, more waves of programs).
        tile, _ = tile_and_warps(d_head)
        for tiles in (1, 4):
            plan = LaunchPlan(tile, tiles * tile, -(-min(width * block, mem + tile) // (tiles * tile)))
            label = f"fused attention, partitions of {tiles} tile{'s' if tiles > 1 else ''}"
            cases.append(Case(label, rows, functools.partial(call, plan=plan), moved))
    return cases


def measure(cases: list[Case], bandwidth: float, timer: Timer) -> list[list[object]]:
    """Rows of the table: what, rows, µs per call, floor (µs), x floor."""
    table = []
    for case in cases:
        seconds = timer(case.call)
        floor = case.moved / bandwidth
        table.append([case.label, case.rows, seconds * 1e6, floor * 1e6, seconds / floor])
    return table


HEADER = ["kernel", "rows", "µs per call", "floor (µs)", "x floor"]
