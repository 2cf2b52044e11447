"""The LayerNorm that finishes `triton.rows_linear`'s post-norm layers: out = LayerNorm(y), y = residual + x @ W^T
+ bias summed in float32 by the tiles of outputs that made it, where no tile holds a whole row.

It comes in two steps, each as wide as the work allows:

1. `tile_statistics`: the program that sums a tile of y [rows, NORM_TILE_N columns] (the last of its splits to
   finish) keeps it (float32) and, for each of its rows, the sum over the tile's columns and the squared
   deviations from the tile's mean;
2. `normalise_rows`: a group of GROUP_ROWS rows takes its mean and variance from those figures (Chan et al.'s
   pairwise combination: each tile's deviations, plus each tile's mean against the row's, so no row is read
   twice) and normalises, in float32, rounding once to the model's dtype. Up to IN_KERNEL_ROWS rows, the last
   tile of the launch to finish does it, group after group (no launch of its own: batch 1 decodes in five
   launches a layer); above, `layer_norm_rows`, one program a group, after the product's launch (where one
   program for 64 rows would make the others wait on a long serial tail).

A row goes through the same operations on the same shapes whichever program normalises it (tiles of
NORM_TILE_N columns, groups of GROUP_ROWS rows, CHUNK_N columns at a time): the same bits at any batch, in a
graph's padded buffers and eagerly. Before: the last program of a row block read each of its rows' `splits`
partial rows one row after another, 1,024 dependent reads a launch at 64 rows (about 100-160 us).
"""

from __future__ import annotations

import functools
from typing import Any

from .common import triton

if triton is not None:
    import triton.language as tl

NORM_TILE_N = 32  # columns of a tile whose statistics are kept, at every tile of rows
GROUP_ROWS = 4  # rows normalised together
IN_KERNEL_ROWS = 16  # up to this many rows, the product's last tile normalises them
CHUNK_ELEMENTS = 4096  # numbers of y a group reads per iteration (GROUP_ROWS x CHUNK_N)


def chunk_columns(outputs: int) -> int:
    """Columns a group normalises per iteration."""
    return min(1 << max(0, outputs - 1).bit_length(), CHUNK_ELEMENTS // GROUP_ROWS)


if triton is not None:

    @triton.jit
    def tile_statistics(
        y, kept, stats, at, rows, row_ok, col_ok, tile_n, M, N, BLOCK_N: tl.constexpr, TILES: tl.constexpr
    ):
        """A summed tile y [BLOCK_M, BLOCK_N] at offsets `at` of a [M, N] matrix: kept there in `kept`, with each
        row's sum over the tile's columns and its squared deviations from the tile's mean in `stats` [2, M,
        TILES]."""
        tl.store(kept + at, y, mask=row_ok[:, None] & col_ok[None, :])
        width = tl.minimum(N - tile_n * BLOCK_N, BLOCK_N).to(tl.float32)  # the tile's columns in the row
        total = tl.sum(tl.where(col_ok[None, :], y, 0.0), axis=1)  # [BLOCK_M]
        centred = tl.where(col_ok[None, :], y - (total / width)[:, None], 0.0)
        tl.store(stats + rows * TILES + tile_n, total, mask=row_ok)
        tl.store(stats + (M + rows) * TILES + tile_n, tl.sum(centred * centred, axis=1), mask=row_ok)

    @triton.jit
    def normalise_rows(
        kept,  # [M, N] float32: y
        stats,  # [2, M, TILES] float32
        norm_w,  # [N]
        norm_b,  # [N]
        out,  # [M, N] model dtype
        first,  # the group's first row
        M,
        N,
        tiles,
        eps,
        BLOCK_N: tl.constexpr,
        TILES: tl.constexpr,
        GROUP: tl.constexpr,
        CHUNK_N: tl.constexpr,
    ):
        """out = LayerNorm(y) for rows first..first+GROUP-1 (those below M)."""
        rows = first + tl.arange(0, GROUP)
        row_ok = rows < M
        t = tl.arange(0, TILES)
        t_ok = (t < tiles)[None, :]
        at = rows[:, None] * TILES + t[None, :]  # [GROUP, TILES]
        # (Beyond `tiles` the figures were never written: read, as whole vectors, and dropped.)
        total = tl.load(stats + at, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        spread = tl.load(stats + M * TILES + at, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        width = tl.maximum(tl.minimum(N - t * BLOCK_N, BLOCK_N), 1).to(tl.float32)[None, :]  # [1, TILES]
        mean = tl.sum(tl.where(t_ok, total, 0.0), axis=1) / N  # [GROUP]
        apart = tl.where(t_ok, total / width - mean[:, None], 0.0)
        variance = tl.sum(tl.where(t_ok, spread + width * apart * apart, 0.0), axis=1) / N
        inverse = tl.rsqrt(variance + eps)
        dtype = out.dtype.element_ty
        for c0 in range(0, N, CHUNK_N):
            cols = c0 + tl.arange(0, CHUNK_N)
            col_ok = cols < N
            where = rows[:, None] * N + cols[None, :]  # [GROUP, CHUNK_N]
            mask = row_ok[:, None] & col_ok[None, :]
            y = tl.load(kept + where, mask=mask, other=0.0, cache_modifier=".cg")
            gain = tl.load(norm_w + cols, mask=col_ok, other=0.0).to(tl.float32)
            shift = tl.load(norm_b + cols, mask=col_ok, other=0.0).to(tl.float32)
            normed = (y - mean[:, None]) * inverse[:, None] * gain[None, :] + shift[None, :]
            tl.store(out + where, normed.to(dtype), mask=mask)


@functools.cache
def jit_kernel() -> Any:
    @triton.jit(do_not_specialize=["M", "eps"])
    def layer_norm_rows(
        kept,
        stats,
        norm_w,
        norm_b,
        out,
        M,
        N,
        tiles,
        eps,
        BLOCK_N: tl.constexpr,
        TILES: tl.constexpr,
        GROUP: tl.constexpr,
        CHUNK_N: tl.constexpr,
    ):
        normalise_rows(
            kept, stats, norm_w, norm_b, out, tl.program_id(0) * GROUP, M, N, tiles, eps, BLOCK_N, TILES, GROUP,
            CHUNK_N,
        )  # fmt: skip

    return layer_norm_rows
