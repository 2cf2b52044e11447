"""A decoding step's linear layers with what follows them, in one Triton kernel: y = act(x) @ W^T + bias, then,
optionally, the residual add and the LayerNorm of a post-norm layer: out = LayerNorm(residual + y).

Decoding multiplies a few rows (one per session) by each weight: a pass over the weight, bound by reading it. The
products come from tensor cores over tiles of [BLOCK_M rows, BLOCK_N outputs, BLOCK_K inputs] (rows beyond the
batch read as zero); the grid splits the outputs into BLOCK_N-wide tiles and, to keep every SM reading at batch 1,
the inputs into `splits` ranges, so that a weight is read once, by many programs at a time. Each program writes
its float32 partial products; the last of a tile's splits to finish (`triton.common` semaphores) adds the parts
in split order (four read at a time), with the bias, and with the LayerNorm the residual, which
`triton.layer_norm` then finishes (up to a few rows in this launch, else in one of its own). `relu_input`
applies the previous layer's bias and ReLU to x as it is read (the feed-forward's inner activation, left bare by
the product that made it), so that product needs nothing after it either. A layer's small operations after its
product (the bias, the residual add, the LayerNorm: three launches and two roundings in the torch path) are then
no launch of their own at batch 1, and one at 64 rows.

Split and tile sizes come from host-known sizes only (rows, the weight's shape, the SM count): a CUDA graph
captures one launch. The weight's shape (N, K, and the inputs a split takes) is specialised on, as Triton does
for integers divisible by 16: fixed per layer and compiled at warm-up, it lets the weights and rows stream as
16-byte vectors through the asynchronous copies that pipeline the product (unspecialised, every load was of 2
bytes, and none pipelined).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import common, layer_norm
from .common import device_guard, next_power_of_2, semaphores, sms, triton, widen_dots
from .layer_norm import GROUP_ROWS, IN_KERNEL_ROWS, NORM_TILE_N, chunk_columns

if triton is not None:
    import triton.language as tl

    from .layer_norm import normalise_rows, tile_statistics

NUM_WARPS = 4
NUM_STAGES = (
    2  # the product's pipeline: the next tiles of x and W copied in while one is multiplied (3 spilled)
)
PROGRAMS_PER_SM = 2  # programs the grid aims for per SM, so that each keeps reads in flight


@dataclass(frozen=True)
class RowsPlan:
    """How a call is split: `block_m` rows, `block_n` outputs and `block_k` inputs a tile; `splits` ranges of
    the inputs, `k_per_split` inputs each (a multiple of block_k)."""

    block_m: int
    block_n: int
    block_k: int
    splits: int
    k_per_split: int


def plan_rows(*, rows: int, outputs: int, inputs: int, sms: int, norm: bool = False) -> RowsPlan:
    """A tile of weights is about 1,024 to 2,048 numbers (BLOCK_N x BLOCK_K), the rows' tile a few more: 96 to 170
    registers a thread, no spills, on sm_80 and sm_90 (tests/model/test_triton_compiled.py). With the LayerNorm
    (`norm`) tiles are NORM_TILE_N outputs wide at every tile of rows. The splits give a batch of one about
    PROGRAMS_PER_SM programs an SM, and depend on the weight's shape only: the order an output's products are
    summed in (ranges of `k_per_split` inputs, BLOCK_K at a time, then the ranges in order) is then the same at any
    batch, and a row gives the same bits alone, in any batch and in a graph's padded buffers."""
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    block_k = 32
    widest = NORM_TILE_N if norm else 64 if block_m == 16 else 32
    block_n = min(widest, max(16, next_power_of_2(outputs)))
    k_blocks = -(-inputs // block_k)
    tiles_at_one_row = -(-outputs // min(64, max(16, next_power_of_2(outputs))))
    splits = max(1, min(k_blocks, -(-PROGRAMS_PER_SM * sms // tiles_at_one_row)))
    k_per_split = -(-k_blocks // splits) * block_k
    return RowsPlan(block_m, block_n, block_k, -(-inputs // k_per_split), k_per_split)


def launch_constants(
    plan: RowsPlan, rows: int, outputs: int, dtype: torch.dtype, *, relu_input: bool, bias: bool, norm: bool
) -> dict[str, Any]:
    """The kernel's compile-time constants for a call of `rows` rows (what `rows_linear` launches, and what
    `bench/triton_report.py` compiles ahead of time for the same call)."""
    return dict(
        BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n,
        BLOCK_K=plan.block_k,
        TILES=next_power_of_2(-(-outputs // plan.block_n)) if norm else 1,
        GROUP=GROUP_ROWS,
        CHUNK_N=chunk_columns(outputs),
        RELU_INPUT=relu_input,
        HAS_BIAS=bias,
        NORM=norm,
        NORM_HERE=norm and rows <= IN_KERNEL_ROWS,  # else triton.layer_norm's launch finishes the rows
        SPLIT=plan.splits > 1 and not norm,  # with the LayerNorm, partial products always (one variant)
        WIDEN=widen_dots(dtype),
        IEEE=dtype == torch.float32,
    )


@functools.cache
def jit_kernel() -> Any:
    @triton.jit(do_not_specialize=["M", "splits", "eps"])
    def rows_linear(
        x,  # [M, K]
        w,  # [N, K]
        in_bias,  # [K] (RELU_INPUT): x is relu(x + in_bias)
        bias,  # [N] (HAS_BIAS)
        residual,  # [M, N] (NORM)
        norm_w,  # [N] (NORM)
        norm_b,  # [N] (NORM)
        partial,  # [splits, M, N] float32 (SPLIT or NORM); with NORM, [0] then holds y, summed
        stats,  # [2, M, TILES] float32 (NORM): triton.layer_norm's figures per row and tile
        sem,  # int32 semaphores: [blocks, tiles] each tile's splits, then (NORM_HERE) the tiles
        out,  # [M, N] (NORM: written by triton.layer_norm)
        M,
        N,
        K,
        k_per_split,
        splits,
        eps,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        TILES: tl.constexpr,  # tiles rounded up to a power of two (NORM)
        GROUP: tl.constexpr,  # rows normalised together (NORM_HERE)
        CHUNK_N: tl.constexpr,  # columns normalised per iteration (NORM_HERE)
        RELU_INPUT: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        NORM: tl.constexpr,
        NORM_HERE: tl.constexpr,  # the last tile normalises the rows (one row block)
        SPLIT: tl.constexpr,
        WIDEN: tl.constexpr,  # widen half-precision tiles before the product (the interpreter)
        IEEE: tl.constexpr,  # float32 tiles: full-precision products (torch's default), not TF32
    ):
        tile_n = tl.program_id(0)
        split = tl.program_id(1)
        block = tl.program_id(2)
        tiles = tl.num_programs(0)
        dtype = out.dtype.element_ty
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < M
        col_ok = cols < N
        tile_ok = row_ok[:, None] & col_ok[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        k_from = split * k_per_split
        for k0 in range(k_from, tl.minimum(k_from + k_per_split, K), BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            a = tl.load(x + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            if RELU_INPUT:
                # In float32, rounded once: what the torch path's bias add then ReLU give (in any dtype).
                lift = tl.load(in_bias + ks, mask=k_ok, other=0.0).to(tl.float32)
                a = tl.maximum(a.to(tl.float32) + lift[None, :], 0.0).to(x.dtype.element_ty)
            b = tl.load(w + cols[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            if WIDEN:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            if IEEE:  # noqa: SIM108 - a compile-time branch: input_precision applies to float32 tiles only
                acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, tl.trans(b), acc)
        at = rows[:, None] * N + cols[None, :]  # [BLOCK_M, BLOCK_N] offsets in a [M, N] matrix
        if not SPLIT and not NORM:
            if HAS_BIAS:
                acc += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(out + at, acc.to(dtype), mask=tile_ok)
        else:
            tl.store(partial + split * M * N + at, acc, mask=tile_ok)
            tl.debug_barrier()  # every thread's stores before the count
            counter = sem + block * tiles + tile_n
            if tl.atomic_add(counter, 1, sem="acq_rel") == splits - 1:  # the tile's last split adds the parts
                y = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                if NORM:
                    y = tl.load(residual + at, mask=tile_ok, other=0.0).to(tl.float32)
                    if HAS_BIAS:
                        y += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
                y = _add_splits(y, partial + at, tile_ok, M * N, splits)
                if NORM:
                    tile_statistics(y, partial, stats, at, rows, row_ok, col_ok, tile_n, M, N, BLOCK_N, TILES)
                    if NORM_HERE:
                        tl.debug_barrier()  # every thread's stores before the count
                        finished = sem + tl.num_programs(2) * tiles + block
                        if tl.atomic_add(finished, 1, sem="acq_rel") == tiles - 1:  # the block's last tile
                            for first in range(
                                block * BLOCK_M, tl.minimum(block * BLOCK_M + BLOCK_M, M), GROUP
                            ):
                                normalise_rows(
                                    partial, stats, norm_w, norm_b, out, first, M, N, tiles, eps, BLOCK_N,
                                    TILES, GROUP, CHUNK_N,
                                )  # fmt: skip
                            tl.atomic_xchg(finished, 0)  # zero again for the next launch
                else:
                    if HAS_BIAS:
                        y += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
                    tl.store(out + at, y.to(dtype), mask=tile_ok)
                tl.atomic_xchg(counter, 0)

    return rows_linear


if triton is not None:

    @triton.jit
    def _add_splits(y, parts, mask, stride, splits):
        """y [BLOCK_M, BLOCK_N] + the `splits` partial tiles at parts, parts + stride, ..., added in order, four
        read at a time (reads that do not wait on one another: one round trip to L2 for four tiles)."""
        for s0 in range(0, splits, 4):
            # [1, 1] flags (a scalar's `&` with a mask breaks under Triton's interpreter)
            has1 = tl.full((1, 1), s0 + 1, tl.int32) < splits
            has2 = tl.full((1, 1), s0 + 2, tl.int32) < splits
            has3 = tl.full((1, 1), s0 + 3, tl.int32) < splits
            p0 = tl.load(parts + s0 * stride, mask=mask, other=0.0, cache_modifier=".cg")
            p1 = tl.load(parts + (s0 + 1) * stride, mask=mask & has1, other=0.0, cache_modifier=".cg")
            p2 = tl.load(parts + (s0 + 2) * stride, mask=mask & has2, other=0.0, cache_modifier=".cg")
            p3 = tl.load(parts + (s0 + 3) * stride, mask=mask & has3, other=0.0, cache_modifier=".cg")
            y += p0
            y = tl.where(has1, y + p1, y)  # (y + 0.0 would turn a -0.0 into 0.0)
            y = tl.where(has2, y + p2, y)
            y = tl.where(has3, y + p3, y)
        return y


def rows_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    relu_input: Tensor | None = None,
    residual: Tensor | None = None,
    norm: tuple[Tensor, Tensor, float] | None = None,
    plan: RowsPlan | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """x [M, K], weight [N, K] (model dtype) -> [M, N]: x @ weight^T + bias, where `relu_input` [K] first makes x
    relu(x + relu_input); with `norm` (LayerNorm weight, bias, eps) and `residual` [M, N], LayerNorm(residual +
    that). `plan` overrides how the call is split (tests); `out` [M, N], contiguous, is written (else a new
    tensor). One launch, and with the LayerNorm above IN_KERNEL_ROWS rows a second (`triton.layer_norm`)."""
    m, k = x.shape
    n = weight.size(0)
    device = x.device
    if plan is None:
        plan = plan_rows(rows=m, outputs=n, inputs=k, sms=sms(device), norm=norm is not None)
    tiles_n, blocks = -(-n // plan.block_n), -(-m // plan.block_m)
    constants = launch_constants(
        plan, m, n, x.dtype, relu_input=relu_input is not None, bias=bias is not None, norm=norm is not None
    )
    with device_guard(device):
        if out is None:
            out = torch.empty((m, n), dtype=x.dtype, device=device)
        assert out.shape == (m, n) and out.dtype == x.dtype and out.is_contiguous()
        partial = stats = counts = out  # not read without partial products
        if constants["SPLIT"] or constants["NORM"]:
            partial = torch.empty((plan.splits, m, n), dtype=torch.float32, device=device)
            counts = semaphores(device, blocks * tiles_n + blocks)
        if constants["NORM"]:
            stats = torch.empty((2, m, constants["TILES"]), dtype=torch.float32, device=device)
        norm_w, norm_b, eps = norm if norm is not None else (out, out, 0.0)
        common.launch(
            jit_kernel(),
            (tiles_n, plan.splits, blocks),
            x,
            weight,
            relu_input if relu_input is not None else out,
            bias if bias is not None else out,
            residual if residual is not None else out,
            norm_w,
            norm_b,
            partial,
            stats,
            counts,
            out,
            m,
            n,
            k,
            plan.k_per_split,
            plan.splits,
            eps,
            **constants,
            num_warps=NUM_WARPS,
            num_stages=NUM_STAGES,
        )
        if constants["NORM"] and not constants["NORM_HERE"]:
            common.launch(
                layer_norm.jit_kernel(),
                (-(-m // GROUP_ROWS),),
                partial,
                stats,
                norm_w,
                norm_b,
                out,
                m,
                n,
                tiles_n,
                eps,
                BLOCK_N=plan.block_n,
                TILES=constants["TILES"],
                GROUP=GROUP_ROWS,
                CHUNK_N=constants["CHUNK_N"],
                num_warps=NUM_WARPS,
                num_stages=NUM_STAGES,
            )
    return out
