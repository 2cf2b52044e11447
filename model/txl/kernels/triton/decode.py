"""The GPU decode kernel (Triton): relative attention of one query per row over paged keys and values, split
across programs along the memory (flash-decoding, PagedAttention v2).

The same contract as the CPU kernel (paged_decode.c): row b's query sits at table position p = start + klen - 1
and sees the keys at positions j in [max(start, p - window + 1), p] of its block table; key j scores
q . K[j] + bd[h, b, P - 1 - (p - j)] (the positional term, computed beforehand for every distance, read here per
key); softmax over j; out = sum_j prob(j) V[j].

Why split: one program per (row, head) walks its memory serially, so at batch 1 a wt103 step (16 heads) keeps 16
programs busy on a GPU with 132 SMs. Here each (row, head) hands partitions of its visible keys to programs of
their own; each keeps a running softmax over its partition (max, normaliser, weighted sum of values) and a second,
small kernel combines the partitions. Where one partition covers every row, the first kernel writes the output
itself and the second is not launched.

Capturable by a CUDA graph: the block tables, lengths and windows are read from device memory, and the number of
partitions (the grid) derives from host-known bounds only: the table's width, the distances the positional
scores cover, the batch size and the device's SM count, never from a row's length.

No recompilation while serving: the integers that vary from step to step (batch size, table width, pool size,
distances, partition size) are marked `do_not_specialize`, so Triton compiles one variant per (dtype, d_head,
block size, split or not), all known at start-up. A warm-up of every variant instead would have needed every
per-step shape up front, crossed with Triton's specialisation of each integer on divisibility by 16 and on 1 (up
to ~27 compilations while serving, by issue 24's count); not specialising costs a few integer multiplications a
program, in a kernel that waits on memory.

Runs on CUDA; on a CPU only under Triton's interpreter (TRITON_INTERPRET=1), which is how the tests check it
against the torch path where no GPU is present.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..decode_rows import DecodeRows, GivenRows
from . import common
from .common import DEFAULT_SMS as DEFAULT_SMS  # re-exported: benchmarks size their grids by it
from .common import available as available
from .common import device_guard, sms, triton
from .common import next_power_of_2 as _next_power_of_2

if triton is not None:
    import triton.language as tl

# One warp a program: its reductions (a tile's scores, the weighted sum of values) are shuffles within the warp;
# across 4 warps they went through shared memory, with 10 to 15 barriers in the loop (0 to 4 now). A tile of
# keys, then of values, is TILE_ELEMENTS numbers: 64 a thread, e.g. 32 keys (two blocks of 16) at d_head 64;
# 80-120 registers, no spills (compiled for sm_80 and sm_90 in tests/model/test_triton_compiled.py).
TILE_ELEMENTS = 2048
NUM_WARPS = 1
# Keys per partition: a few hundred where the grid is full anyway; fewer (down to one tile) where (rows x heads)
# would leave SMs idle, so that a batch of 1 still spreads over the GPU. A one-warp program has one tile of keys
# (4 KiB in bf16) in flight at a time; an SM needs a few of them to cover memory latency at full bandwidth.
PARTITION_KEYS = 256
PROGRAMS_PER_SM = 4
# Partitions the combining kernel reads per iteration.
COMBINE_CHUNK = 16


def supports_block_size(block_size: int) -> bool:
    """Whether the kernel reads pools of `block_size` positions a block. Any size: keys are addressed one by one
    (table[j // bs], slot j % bs with bs a compile-time constant), so a tile never has to match a block and no
    `tl.arange` spans one. Powers of two turn the division into a shift."""
    return block_size >= 1


@dataclass(frozen=True)
class LaunchPlan:
    """How a call is split, from host-known sizes only: `tile` keys per iteration, `partition` keys (a multiple
    of tile) per program, `partitions` programs per (row, head)."""

    tile: int
    partition: int
    partitions: int

    @property
    def split(self) -> bool:
        return self.partitions > 1


def plan_launch(
    *, batch: int, heads: int, d_head: int, table_width: int, block_size: int, n_pos: int, sms: int
) -> LaunchPlan:
    """Partitions for a call. The keys a row sees span at most min(table_width * block_size, n_pos) positions
    (its window never reaches beyond the positional scores: the kernel clamps it there), from the tile boundary
    at or before its first key: that bound, not the rows' lengths, sizes the grid."""
    tile = tile_keys(d_head)
    span = min(table_width * block_size, n_pos + tile - 1)
    tiles = max(1, -(-span // tile))
    partition_tiles = PARTITION_KEYS // tile
    # Halve the partition while the grid would leave SMs idle, down to one tile.
    while partition_tiles > 1 and batch * heads * -(-tiles // partition_tiles) < PROGRAMS_PER_SM * sms:
        partition_tiles //= 2
    partition_tiles = min(partition_tiles, tiles)
    return LaunchPlan(tile, tile * partition_tiles, -(-tiles // partition_tiles))


def tile_keys(d_head: int) -> int:
    """Keys a program reads per iteration (a power of two, 16 to 64)."""
    return max(16, min(64, TILE_ELEMENTS // _next_power_of_2(d_head)))


@functools.cache
def jit_kernels() -> tuple[Any, Any]:
    """(partitions kernel, combining kernel), defined on first use (Triton may be absent)."""

    # Every integer that changes from step to step: specialising on them would compile a variant per value class.
    @triton.jit(do_not_specialize=["B", "S", "NB", "P", "window_stride", "partition", "num_parts"])
    def paged_decode_partitions(
        q,  # [B, H, D] float32
        bd,  # [H, B, P] float32
        keys,  # [H, NB, BS, D]
        values,
        table,  # [B, S] int64
        starts,  # [B] int64
        klens,  # [B] int64
        windows,  # [B] int64, row stride window_stride
        part_max,  # [B, H, num_parts] float32 (SPLIT)
        part_sum,  # [B, H, num_parts] float32 (SPLIT)
        part_acc,  # [B, H, num_parts, D] float32 (SPLIT)
        out,  # [B, H, D] float32 (not SPLIT)
        B,
        H,
        S,
        NB,
        P,
        window_stride,
        partition,  # keys per program, a multiple of TILE
        num_parts,
        D: tl.constexpr,
        BS: tl.constexpr,
        BLOCK_D: tl.constexpr,
        TILE: tl.constexpr,
        SPLIT: tl.constexpr,
    ):
        row = tl.program_id(0)  # b * H + h
        part = tl.program_id(1)
        b = row // H
        h = row % H
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < D
        query = tl.load(q + row * D + dims, mask=dim_ok, other=0.0)
        start = tl.load(starts + b)
        p = start + tl.load(klens + b) - 1  # the query's position in its table
        # The window, and never a key without a positional score (bd covers distances 0..P-1).
        first = tl.maximum(start, p - tl.minimum(tl.load(windows + b * window_stride), P) + 1)
        # Partitions start at the tile boundary at or before the first key.
        lo = first - first % TILE + part * partition
        hi = tl.minimum(lo + partition, p + 1)
        slots = tl.arange(0, TILE)
        running_max = tl.full((), float("-inf"), tl.float32)
        normaliser = tl.zeros((), tl.float32)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        head = h.to(tl.int64) * NB * BS * D
        positional = bd + (h * B + b).to(tl.int64) * P + (P - 1 - p)
        for t in range(lo, hi, TILE):
            j = t + slots  # [TILE] key positions in the table
            valid = (j >= first) & (j <= p)
            block = tl.load(table + b * S + j // BS, mask=valid, other=0)
            offsets = head + (block * BS + j % BS)[:, None] * D + dims[None, :]  # [TILE, BLOCK_D]
            tile_mask = valid[:, None] & dim_ok[None, :]
            k = tl.load(keys + offsets, mask=tile_mask, other=0.0).to(tl.float32)
            score = tl.sum(k * query[None, :], axis=1) + tl.load(positional + j, mask=valid, other=0.0)
            score = tl.where(valid, score, float("-inf"))
            # Every tile holds a visible key (t <= p, and the first tile holds `first`): new_max is finite.
            new_max = tl.maximum(running_max, tl.max(score, axis=0))
            scale = tl.exp(running_max - new_max)
            weight = tl.exp(score - new_max)  # [TILE], 0 where hidden
            v = tl.load(values + offsets, mask=tile_mask, other=0.0).to(tl.float32)
            normaliser = normaliser * scale + tl.sum(weight, axis=0)
            acc = acc * scale + tl.sum(weight[:, None] * v, axis=0)
            running_max = new_max
        if SPLIT:  # an empty partition (beyond the row's keys) stores max -inf, normaliser 0
            slot = row * num_parts + part
            tl.store(part_max + slot, running_max)
            tl.store(part_sum + slot, normaliser)
            tl.store(part_acc + slot * D + dims, acc, mask=dim_ok)
        else:
            tl.store(out + row * D + dims, acc / normaliser, mask=dim_ok)

    @triton.jit(do_not_specialize=["num_parts"])
    def paged_decode_combine(
        part_max,  # [B, H, num_parts] float32
        part_sum,
        part_acc,  # [B, H, num_parts, D]
        out,  # [B, H, D] float32
        num_parts,
        D: tl.constexpr,
        BLOCK_D: tl.constexpr,
        CHUNK: tl.constexpr,
    ):
        row = tl.program_id(0)  # b * H + h
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < D
        parts = tl.arange(0, CHUNK)
        base = row * num_parts
        # The largest partition maximum first: partition 0 always holds the row's first key, so it is finite and
        # every weight below is exp(finite or -inf) (no -inf - -inf).
        best = tl.full((), float("-inf"), tl.float32)
        for c in range(0, num_parts, CHUNK):
            found = tl.load(part_max + base + c + parts, mask=c + parts < num_parts, other=float("-inf"))
            best = tl.maximum(best, tl.max(found, axis=0))
        total = tl.zeros((), tl.float32)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        for c in range(0, num_parts, CHUNK):
            ok = c + parts < num_parts
            weight = tl.exp(
                tl.load(part_max + base + c + parts, mask=ok, other=float("-inf")) - best
            )  # [CHUNK]
            total += tl.sum(weight * tl.load(part_sum + base + c + parts, mask=ok, other=0.0), axis=0)
            offsets = (base + c + parts)[:, None] * D + dims[None, :]  # [CHUNK, BLOCK_D]
            partial = tl.load(part_acc + offsets, mask=ok[:, None] & dim_ok[None, :], other=0.0)
            acc += tl.sum(weight[:, None] * partial, axis=0)
        tl.store(out + row * D + dims, acc / total, mask=dim_ok)

    return paged_decode_partitions, paged_decode_combine


def triton_paged_decode(
    q: Tensor, bd: Tensor, keys: Tensor, values: Tensor, rows: DecodeRows, *, plan: LaunchPlan | None = None
) -> Tensor:
    """q [B, H, Dh], bd [H, B, P] float32, keys/values [H, NB, bs, Dh] -> [B, H, Dh] float32. `plan` overrides
    how the call is split (tests split small memories)."""
    table, starts, key_lengths, windows = rows.table, rows.starts, rows.key_lengths, rows.windows
    batch, heads, d_head = q.shape
    _, n_blocks, block_size, _ = keys.shape
    if not supports_block_size(block_size):
        raise ValueError(f"block size {block_size} is not supported by the Triton decode kernel")
    n_pos = bd.size(2)
    if plan is None:
        plan = plan_launch(
            batch=batch,
            heads=heads,
            d_head=d_head,
            table_width=table.size(1),
            block_size=block_size,
            n_pos=n_pos,
            sms=sms(q.device),
        )
    partitions_kernel, combine_kernel = jit_kernels()
    block_d = _next_power_of_2(d_head)
    device = q.device
    with device_guard(device):
        out = torch.empty((batch, heads, d_head), dtype=torch.float32, device=device)
        if plan.split:
            part_max = torch.empty((batch, heads, plan.partitions), dtype=torch.float32, device=device)
            part_sum = torch.empty_like(part_max)
            part_acc = torch.empty(
                (batch, heads, plan.partitions, d_head), dtype=torch.float32, device=device
            )
        else:  # not read: the kernel writes `out` directly
            part_max = part_sum = part_acc = out
        common.launch(
            partitions_kernel,
            (batch * heads, plan.partitions),
            q.float().contiguous(),
            bd.contiguous(),
            keys,
            values,
            table.contiguous(),
            starts,
            key_lengths,
            windows,  # [B] or [B, 1]: row b's window at b * stride(0)
            part_max,
            part_sum,
            part_acc,
            out,
            batch,
            heads,
            table.size(1),
            n_blocks,
            n_pos,
            windows.stride(0),
            plan.partition,
            plan.partitions,
            D=d_head,
            BS=block_size,
            BLOCK_D=block_d,
            TILE=plan.tile,
            SPLIT=plan.split,
            num_warps=NUM_WARPS,
        )
        if plan.split:
            common.launch(
                combine_kernel,
                (batch * heads,),
                part_max,
                part_sum,
                part_acc,
                out,
                plan.partitions,
                D=d_head,
                BLOCK_D=block_d,
                CHUNK=COMBINE_CHUNK,
                num_warps=1,
            )
    return out


def warm_up(device: torch.device, dtype: torch.dtype, *, heads: int, d_head: int, block_size: int) -> None:
    """Compiles, at start-up, every variant a pool of `dtype` can launch while serving: the split kernel with its
    combining kernel, and the single pass (the other launch parameters are not specialised on). One row of two
    positions, in blocks 1 and 2 of a three-block pool."""
    keys = torch.zeros((heads, 3, block_size, d_head), dtype=dtype, device=device)

    def index(*values: object) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    # Positions bs - 1 and bs: the end of block 1 and the start of block 2.
    rows = GivenRows(index([1, 2]), index(block_size - 1), index(2), index(3))
    q = torch.zeros((1, heads, d_head), device=device)
    bd = torch.zeros((heads, 1, 2), device=device)
    tile = tile_keys(d_head)
    for plan in (LaunchPlan(tile, tile, 2), LaunchPlan(tile, 2 * tile, 1)):
        triton_paged_decode(q, bd, keys, keys, rows, plan=plan)
