"""A decoding step's whole attention in one Triton kernel: the query's biases and scale, the positional term, the
new position's keys and values, attention over the row's blocks, and the combination of its partitions.

What the layer-by-layer path does in a dozen launches (`txl.attention.group_attention` with `triton.decode`:
the keys and values written into the pool, q + u and q + v scaled, the positional product for every distance
and its cast, the partitions, their combination, the output's cast), each program here does for its (row, head,
partition), reading the layer's fused projection `qkv` [B, 3, H, Dh] as the projection wrote it:

- q_content = (q + u) * scale and q_position = (q + v) * scale, rounded to the model's dtype as the torch path
  rounds them;
- for key j at distance d = p - j: q_content . K[j] + q_position . R[d], with R the layer's positional table
  (the product rounded to the model's dtype, as the torch path's product is); softmax over the keys the row's
  window shows (`txl.kernels.triton.decode` has the contract: positions, windows, partitions);
- the new position p's key and value come from `qkv` (in registers): the program whose partition holds p also
  writes them to the pool, at the slot the step planned for them, so no other program ever reads that slot;
- where a row's keys are split over several programs (to fill the GPU at batch 1), the last of them to finish
  (`triton.common` semaphores) combines the partitions, in partition order, and writes the row's output.

The grid is sized from host-known bounds only (`plan_partitions`), so a CUDA graph captures it; partitions have a
fixed size, so a row's result does not depend on the batch it is in or on the width of the table it is read from
(a graph's buffers are wider than an eager step's): a graph replay gives the eager step's bits.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from ..decode_rows import DecodeRows
from . import common
from .common import device_guard, next_power_of_2, semaphores, triton
from .decode import LaunchPlan, tile_keys

if triton is not None:
    import triton.language as tl

# Numbers in a tile a warp holds: a program reads a tile of keys, of their positional keys and of values per
# iteration, 16 keys at d_head 64 on one warp (its reductions stay within the warp, as in `triton.decode`), two
# warps from d_head 128: 80 to 130 registers, no spills (tests/model/test_triton_compiled.py).
TILE_ELEMENTS = 1024
MIN_TILE = 16
# The last program of a row combines its partitions: their maxima COMBINE_STATS at a time (a wt103 row's 51 in
# one read), then their sums and weighted values COMBINE_CHUNK partitions at a time.
COMBINE_STATS = 128
COMBINE_CHUNK = 32


# Tiles of keys a partition holds, whatever the batch or the table: a row's partitions, and so the order its sums
# are taken in, depend on its own keys only, so that a row gives the same bits in a graph's padded buffers as in an
# eager step, alone or in any batch.
PARTITION_TILES = 2


def plan_partitions(*, d_head: int, table_width: int, block_size: int, n_pos: int) -> LaunchPlan:
    """Partitions of PARTITION_TILES tiles of keys (32 keys at wt103's d_head), enough for the most keys a row can
    see (from host-known bounds: the table's width and the distances the positional table covers, from the tile
    boundary at or before its first key), so that a CUDA graph captures the grid.

    Why two tiles: a program reads its tiles one after another (a round trip to HBM each), which is what a batch
    of one waits on, and its last program combines the partitions' sums, which the others wrote. Four tiles (26
    partitions a wt103 row, before) made a batch of one wait on four trips in turn; one tile (101 partitions) makes
    the sums 6% of the bytes a step moves at 64 rows and more waves of programs than the keys' bytes take, and its
    last program reads twice as many sums. Two keep most of one tile's gain at batch 1 and about a third of its
    cost at 64 rows (docs/benchmarks.md, the estimate; `python -m bench gpu` times 1, 2 and 4 tiles)."""
    tile, _ = tile_and_warps(d_head)
    span = min(table_width * block_size, n_pos + tile - 1)
    keys = PARTITION_TILES * tile
    return LaunchPlan(tile, keys, max(1, -(-span // keys)))


def tile_and_warps(d_head: int) -> tuple[int, int]:
    """(keys a program reads per iteration, warps a program)."""
    block_d = next_power_of_2(d_head)
    tile = min(tile_keys(d_head), max(MIN_TILE, TILE_ELEMENTS // block_d))  # divides the plan's partitions
    return tile, max(1, tile * block_d // TILE_ELEMENTS)


@functools.cache
def jit_kernel() -> Any:
    # Every integer that changes from step to step: specialising on them would compile a variant per value class.
    @triton.jit(
        do_not_specialize=["B", "S", "NB", "P", "P_TAB", "window_stride", "partition", "num_parts", "scale"]
    )
    def decode_attention(
        qkv,  # [B, 3, H, D] model dtype
        u,  # [H, D] content bias (r_w_bias)
        v,  # [H, D] position bias (r_r_bias)
        pos,  # [H, P_TAB, D]: positional keys for distances P_TAB-1..0
        keys,  # [H, NB, BS, D] this layer's pool
        values,
        table,  # [B, S] int64
        starts,  # [B] int64
        klens,  # [B] int64
        windows,  # [B] int64, row stride window_stride
        write_blocks,  # [B] int64: where the new position's key and value go
        write_slots,  # [B] int64
        part_max,  # [B, H, num_parts] float32 (SPLIT)
        part_sum,  # [B, H, num_parts] float32 (SPLIT)
        part_acc,  # [B, H, num_parts, D] float32 (SPLIT)
        sem,  # int32 semaphores, [B * H] used (SPLIT)
        out,  # [B, H, D] model dtype
        scale,
        B,
        S,
        NB,
        P,
        P_TAB,
        window_stride,
        partition,  # keys per program, a multiple of TILE
        num_parts,
        H: tl.constexpr,
        D: tl.constexpr,
        BS: tl.constexpr,
        BLOCK_D: tl.constexpr,
        TILE: tl.constexpr,
        SPLIT: tl.constexpr,
        STATS: tl.constexpr,
        CHUNK: tl.constexpr,
    ):
        row = tl.program_id(0)  # b * H + h
        part = tl.program_id(1)
        b = row // H
        h = row % H
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < D
        dtype = out.dtype.element_ty
        base = qkv + b.to(tl.int64) * (3 * H * D) + h * D
        q = tl.load(base + dims, mask=dim_ok, other=0.0).to(tl.float32)
        k_new = tl.load(base + H * D + dims, mask=dim_ok, other=0.0)
        v_new = tl.load(base + 2 * H * D + dims, mask=dim_ok, other=0.0)
        # As the torch path rounds them: (q + u), then its product by the scale, each rounded to the model's dtype
        # (float32 arithmetic, one rounding each: what torch's half-precision operations do).
        u_h = tl.load(u + h * D + dims, mask=dim_ok, other=0.0).to(tl.float32)
        v_h = tl.load(v + h * D + dims, mask=dim_ok, other=0.0).to(tl.float32)
        q_content = ((q + u_h).to(dtype).to(tl.float32) * scale).to(dtype).to(tl.float32)
        q_position = ((q + v_h).to(dtype).to(tl.float32) * scale).to(dtype).to(tl.float32)
        start = tl.load(starts + b)
        p = start + tl.load(klens + b) - 1  # the query's position in its table
        # The window, and never a key without a positional score (distances 0..P-1).
        first = tl.maximum(start, p - tl.minimum(tl.load(windows + b * window_stride), P) + 1)
        lo = first - first % TILE + part * partition
        hi = tl.minimum(lo + partition, p + 1)
        slots = tl.arange(0, TILE)
        running_max = tl.full((), float("-inf"), tl.float32)
        normaliser = tl.zeros((), tl.float32)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        head = h.to(tl.int64) * NB * BS * D
        positional = pos + h.to(tl.int64) * P_TAB * D + (P_TAB - 1 - p) * D  # distance d = p - j at row j
        k_new_f = k_new.to(tl.float32)
        v_new_f = v_new.to(tl.float32)
        for t in range(lo, hi, TILE):
            j = t + slots  # [TILE] key positions in the table
            valid = (j >= first) & (j <= p)
            pooled = valid & (j < p)  # the new position is not in the pool yet
            block = tl.load(table + b * S + j // BS, mask=pooled, other=0)
            offsets = head + (block * BS + j % BS)[:, None] * D + dims[None, :]  # [TILE, BLOCK_D]
            tile_mask = pooled[:, None] & dim_ok[None, :]
            is_new = (j == p)[:, None]
            k = tl.load(keys + offsets, mask=tile_mask, other=0.0).to(tl.float32)
            k = tl.where(is_new, k_new_f[None, :], k)
            r = tl.load(
                positional + j[:, None] * D + dims[None, :], mask=valid[:, None] & dim_ok[None, :], other=0.0
            )
            bd = tl.sum(r.to(tl.float32) * q_position[None, :], axis=1).to(dtype).to(tl.float32)
            score = tl.sum(k * q_content[None, :], axis=1) + bd
            score = tl.where(valid, score, float("-inf"))
            # Every tile holds a visible key (t <= p, and the first tile holds `first`): new_max is finite.
            new_max = tl.maximum(running_max, tl.max(score, axis=0))
            correction = tl.exp(running_max - new_max)
            weight = tl.exp(score - new_max)  # [TILE], 0 where hidden
            val = tl.load(values + offsets, mask=tile_mask, other=0.0).to(tl.float32)
            val = tl.where(is_new, v_new_f[None, :], val)
            normaliser = normaliser * correction + tl.sum(weight, axis=0)
            acc = acc * correction + tl.sum(weight[:, None] * val, axis=0)
            running_max = new_max
        if (p >= lo) & (p < hi):  # this program's partition holds the new position: it writes it
            slot = head + (tl.load(write_blocks + b) * BS + tl.load(write_slots + b)) * D
            tl.store(keys + slot + dims, k_new, mask=dim_ok)
            tl.store(values + slot + dims, v_new, mask=dim_ok)
        if SPLIT:  # an empty partition (beyond the row's keys) stores max -inf, normaliser 0
            at = row * num_parts + part
            tl.store(part_max + at, running_max)
            tl.store(part_sum + at, normaliser)
            tl.store(part_acc + at * D + dims, acc, mask=dim_ok)
            tl.debug_barrier()  # every thread's stores before the count
            if tl.atomic_add(sem + row, 1, sem="acq_rel") == num_parts - 1:  # the last partition to finish
                from_row = row * num_parts
                # Partition 0 holds the row's first key: the largest maximum is finite (no -inf - -inf below).
                best = tl.full((), float("-inf"), tl.float32)
                for c in range(0, num_parts, STATS):
                    at_c = c + tl.arange(0, STATS)
                    found = tl.load(
                        part_max + from_row + at_c,
                        mask=at_c < num_parts,
                        other=float("-inf"),
                        cache_modifier=".cg",
                    )
                    best = tl.maximum(best, tl.max(found, axis=0))
                total = tl.zeros((), tl.float32)
                acc = tl.zeros((BLOCK_D,), tl.float32)
                parts = tl.arange(0, CHUNK)
                for c in range(0, num_parts, CHUNK):
                    ok = c + parts < num_parts
                    at_c = from_row + c + parts
                    weight = tl.exp(
                        tl.load(part_max + at_c, mask=ok, other=float("-inf"), cache_modifier=".cg") - best
                    )  # [CHUNK]
                    sums = tl.load(part_sum + at_c, mask=ok, other=0.0, cache_modifier=".cg")
                    total += tl.sum(weight * sums, axis=0)
                    partial = tl.load(
                        part_acc + at_c[:, None] * D + dims[None, :],
                        mask=ok[:, None] & dim_ok[None, :],
                        other=0.0,
                        cache_modifier=".cg",
                    )  # [CHUNK, BLOCK_D]
                    acc += tl.sum(weight[:, None] * partial, axis=0)
                tl.store(out + row * D + dims, (acc / total).to(dtype), mask=dim_ok)
                tl.atomic_xchg(sem + row, 0)  # zero again for the next launch
        else:
            tl.store(out + row * D + dims, (acc / normaliser).to(dtype), mask=dim_ok)

    return decode_attention


def decode_attention(
    qkv: Tensor,
    u: Tensor,
    v: Tensor,
    positions: Tensor,
    keys: Tensor,
    values: Tensor,
    rows: DecodeRows,
    write_blocks: Tensor,
    write_slots: Tensor,
    *,
    scale: float,
    n_pos: int,
    plan: LaunchPlan | None = None,
) -> Tensor:
    """qkv [B, 3*H*Dh] (a layer's fused projection, model dtype), u, v [H, Dh], positions [H, P', Dh] (distances
    P'-1..0, P' >= n_pos), keys/values [H, NB, bs, Dh] (this layer's pool: the new keys and values are written
    at `write_blocks`, `write_slots` [B]) -> [B, H*Dh] the attention output, in the model's dtype. `n_pos`: the
    distances the step's windows are clamped to; `plan` overrides how the call is split (tests)."""
    heads, n_blocks, block_size, d_head = keys.shape
    batch = qkv.size(0)
    table = rows.table
    if plan is None:
        plan = plan_partitions(d_head=d_head, table_width=table.size(1), block_size=block_size, n_pos=n_pos)
    tile, warps = tile_and_warps(d_head)
    assert plan.partition % tile == 0  # partitions are whole tiles
    device = qkv.device
    with device_guard(device):
        out = torch.empty((batch, heads * d_head), dtype=qkv.dtype, device=device)
        if plan.split:
            part_max = torch.empty((batch, heads, plan.partitions), dtype=torch.float32, device=device)
            part_sum = torch.empty_like(part_max)
            part_acc = torch.empty(
                (batch, heads, plan.partitions, d_head), dtype=torch.float32, device=device
            )
            counts = semaphores(device, batch * heads)
        else:  # not read: the kernel writes `out` directly
            part_max = part_sum = part_acc = counts = out
        common.launch(
            jit_kernel(),
            (batch * heads, plan.partitions),
            qkv,
            u,
            v,
            positions,
            keys,
            values,
            table,
            rows.starts,
            rows.key_lengths,
            rows.windows,  # [B] or [B, 1]: row b's window at b * stride(0)
            write_blocks,
            write_slots,
            part_max,
            part_sum,
            part_acc,
            counts,
            out,
            scale,
            batch,
            table.size(1),
            n_blocks,
            n_pos,
            positions.size(1),
            rows.windows.stride(0),
            plan.partition,
            plan.partitions,
            H=heads,
            D=d_head,
            BS=block_size,
            BLOCK_D=next_power_of_2(d_head),
            TILE=tile,
            SPLIT=plan.split,
            STATS=COMBINE_STATS,
            CHUNK=COMBINE_CHUNK,
            num_warps=warps,
        )
    return out
