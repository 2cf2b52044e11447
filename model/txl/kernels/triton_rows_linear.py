"""A decoding step's linear layers with what follows them, in one Triton kernel: y = act(x) @ W^T + bias, then,
optionally, the residual add and the LayerNorm of a post-norm layer: out = LayerNorm(residual + y).

Decoding multiplies a few rows (one per session) by each weight: a pass over the weight, bound by reading it. The
products come from tensor cores over tiles of [BLOCK_M rows, BLOCK_N outputs, BLOCK_K inputs] (rows beyond the
batch read as zero); the grid splits the outputs into BLOCK_N-wide tiles and, to keep every SM reading at batch 1,
the inputs into `splits` ranges, so that a weight is read once, by many programs at a time. Each program writes
its float32 partial products; the last of a row block's programs to finish (`triton_common` semaphores) adds the
parts in split order, the bias and the residual, and normalises the whole row, in float32, rounding once to the
model's dtype. A layer's small operations after its product (the bias, the residual add, the LayerNorm: three
launches and two roundings in the torch path) are then no launch of their own. `relu_input` applies the
previous layer's bias and ReLU to x as it is read (the feed-forward's inner activation, left bare by the product
that made it), so that product needs nothing after it either.

Split and tile sizes come from host-known sizes only (rows, the weight's shape, the SM count): a CUDA graph
captures one launch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import triton_common
from .triton_common import device_guard, next_power_of_2, semaphores, sms, triton, widen_dots

if triton is not None:
    import triton.language as tl

NUM_WARPS = 4
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


def plan_rows(*, rows: int, outputs: int, inputs: int, sms: int) -> RowsPlan:
    """A tile of weights is about 2,048 numbers (BLOCK_N x BLOCK_K), the rows' tile a few more: 96 to 170
    registers a thread, no spills, on sm_80 and sm_90 (tests/model/test_triton_compiled.py). The splits give a
    batch of one about PROGRAMS_PER_SM programs an SM, and depend on the weight's shape only: the order an output's
    products are summed in (ranges of `k_per_split` inputs, BLOCK_K at a time, then the ranges in order) is then the
    same at any batch, and a row gives the same bits alone, in any batch and in a graph's padded buffers."""
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    block_k = 32
    block_n = min(64 if block_m == 16 else 32, max(16, next_power_of_2(outputs)))
    k_blocks = -(-inputs // block_k)
    tiles_at_one_row = -(-outputs // min(64, max(16, next_power_of_2(outputs))))
    splits = max(1, min(k_blocks, -(-PROGRAMS_PER_SM * sms // tiles_at_one_row)))
    k_per_split = -(-k_blocks // splits) * block_k
    return RowsPlan(block_m, block_n, block_k, -(-inputs // k_per_split), k_per_split)


@functools.cache
def jit_kernel() -> Any:
    @triton.jit(do_not_specialize=["M", "N", "K", "k_per_split", "splits", "eps"])
    def rows_linear(
        x,  # [M, K]
        w,  # [N, K]
        in_bias,  # [K] (RELU_INPUT): x is relu(x + in_bias)
        bias,  # [N] (HAS_BIAS)
        residual,  # [M, N] (NORM)
        norm_w,  # [N] (NORM)
        norm_b,  # [N] (NORM)
        partial,  # [splits, M, N] float32 (SPLIT or NORM)
        sem,  # int32 semaphores
        out,  # [M, N]
        M,
        N,
        K,
        k_per_split,
        splits,
        eps,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_ROW: tl.constexpr,  # N rounded up to a power of two (NORM)
        RELU_INPUT: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        NORM: tl.constexpr,
        SPLIT: tl.constexpr,
        WIDEN: tl.constexpr,  # widen half-precision tiles before the product (the interpreter)
        IEEE: tl.constexpr,  # float32 tiles: full-precision products (torch's default), not TF32
    ):
        tile_n = tl.program_id(0)
        split = tl.program_id(1)
        block = tl.program_id(2)
        dtype = out.dtype.element_ty
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < M
        col_ok = cols < N
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
        if not SPLIT and not NORM:
            if HAS_BIAS:
                acc += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(
                out + rows[:, None] * N + cols[None, :], acc.to(dtype), mask=row_ok[:, None] & col_ok[None, :]
            )
        else:
            here = partial + (split * M + rows[:, None]) * N + cols[None, :]
            tl.store(here, acc, mask=row_ok[:, None] & col_ok[None, :])
            tl.debug_barrier()  # every thread's stores before the count
            if NORM:  # the row block's last program normalises its rows
                counter = sem + block
                parts = splits * tl.num_programs(0)
            else:  # the tile's last split adds the parts
                counter = sem + block * tl.num_programs(0) + tile_n
                parts = splits
            if tl.atomic_add(counter, 1, sem="acq_rel") == parts - 1:
                if NORM:
                    line = tl.arange(0, BLOCK_ROW)
                    line_ok = line < N
                    gain = tl.load(norm_w + line, mask=line_ok, other=0.0).to(tl.float32)
                    shift = tl.load(norm_b + line, mask=line_ok, other=0.0).to(tl.float32)
                    lift = tl.zeros((BLOCK_ROW,), tl.float32)
                    if HAS_BIAS:
                        lift = tl.load(bias + line, mask=line_ok, other=0.0).to(tl.float32)
                    for r in range(BLOCK_M):
                        m = block * BLOCK_M + r
                        if m < M:
                            y = (
                                tl.load(residual + m * N + line, mask=line_ok, other=0.0).to(tl.float32)
                                + lift
                            )
                            for s in range(splits):
                                y += tl.load(
                                    partial + (s * M + m) * N + line,
                                    mask=line_ok,
                                    other=0.0,
                                    cache_modifier=".cg",
                                )
                            mean = tl.sum(tl.where(line_ok, y, 0.0), axis=0) / N
                            centred = tl.where(line_ok, y - mean, 0.0)
                            variance = tl.sum(centred * centred, axis=0) / N
                            normed = centred * tl.rsqrt(variance + eps) * gain + shift
                            tl.store(out + m * N + line, normed.to(dtype), mask=line_ok)
                else:
                    y = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                    for s in range(splits):
                        y += tl.load(
                            partial + (s * M + rows[:, None]) * N + cols[None, :],
                            mask=row_ok[:, None] & col_ok[None, :],
                            other=0.0,
                            cache_modifier=".cg",
                        )
                    if HAS_BIAS:
                        y += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
                    tl.store(
                        out + rows[:, None] * N + cols[None, :],
                        y.to(dtype),
                        mask=row_ok[:, None] & col_ok[None, :],
                    )
                tl.atomic_xchg(counter, 0)  # zero again for the next launch

    return rows_linear


def rows_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    relu_input: Tensor | None = None,
    residual: Tensor | None = None,
    norm: tuple[Tensor, Tensor, float] | None = None,
    plan: RowsPlan | None = None,
) -> Tensor:
    """x [M, K], weight [N, K] (model dtype) -> [M, N]: x @ weight^T + bias, where `relu_input` [K] first makes x
    relu(x + relu_input); with `norm` (LayerNorm weight, bias, eps) and `residual` [M, N], LayerNorm(residual +
    that). `plan` overrides how the call is split (tests)."""
    m, k = x.shape
    n = weight.size(0)
    device = x.device
    if plan is None:
        plan = plan_rows(rows=m, outputs=n, inputs=k, sms=sms(device))
    tiles_n, blocks = -(-n // plan.block_n), -(-m // plan.block_m)
    split = plan.splits > 1 and norm is None  # with the LayerNorm, partial products always (one variant)
    with device_guard(device):
        out = torch.empty((m, n), dtype=x.dtype, device=device)
        partial: Tensor = out
        counts: Tensor = out
        if split or norm is not None:
            partial = torch.empty((plan.splits, m, n), dtype=torch.float32, device=device)
            counts = semaphores(device, blocks * tiles_n)
        norm_w, norm_b, eps = norm if norm is not None else (out, out, 0.0)
        triton_common.launch(
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
            counts,
            out,
            m,
            n,
            k,
            plan.k_per_split,
            plan.splits,
            eps,
            BLOCK_M=plan.block_m,
            BLOCK_N=plan.block_n,
            BLOCK_K=plan.block_k,
            BLOCK_ROW=next_power_of_2(n),
            RELU_INPUT=relu_input is not None,
            HAS_BIAS=bias is not None,
            NORM=norm is not None,
            SPLIT=split,
            WIDEN=widen_dots(x.dtype),
            IEEE=x.dtype == torch.float32,
            num_warps=NUM_WARPS,
        )
    return out
