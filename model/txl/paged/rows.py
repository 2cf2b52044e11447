"""A sequence's memory as rows of a block pool, and how one step makes room in the pool for a row's new positions.

A `PagedRow` is one sequence's memory: a `BlockTable` of the pool, the offset of its first position in the first
block and its length. `plan_row` makes room for a step's new positions after a row (claiming, copying on write,
allocating, see txl.paged.pool) and says where they go (`RowStep`); `new_blocks` counts what that will take from
the pool, and `peak_blocks`/`resting_blocks` what a memory can span, for budgets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .pool import DEFAULT_BLOCK_SIZE, BlockPool, BlockTable, Reservation


# Immutable by contract, not `frozen`: a decoding step makes one per row, and a frozen dataclass's __init__ (one
# object.__setattr__ per field) costs several times as much, a visible share of the host's time around a large
# decoding graph (docs/model.md).
@dataclass(slots=True, unsafe_hash=True)
class PagedRow:
    """One sequence's memory: positions [start, start + length) of the concatenated blocks of `table`, the last
    `length` of the `fed` positions the sequence has been fed (its absolute positions are fed - length .. fed - 1).
    Never changed once made (memories share rows)."""

    table: BlockTable | None
    start: int = 0
    length: int = 0
    fed: int = -1  # -1: as many as it holds (a memory whose history is unknown)

    def __post_init__(self) -> None:
        if self.fed < 0:
            self.fed = self.length
        elif self.fed < self.length:
            raise ValueError(f"a row cannot hold {self.length} positions of {self.fed} fed")

    @property
    def ids(self) -> np.ndarray:
        return self.table.ids if self.table is not None else np.zeros(0, dtype=np.int64)

    @property
    def end(self) -> int:
        return self.start + self.length


EMPTY_ROW = PagedRow(None)


@dataclass(frozen=True, slots=True)
class RowStep:
    """One row of a step: where its new positions are written, what attention reads, what it keeps."""

    table: BlockTable  # blocks attention reads: the memory and the new positions (held by the step)
    start: int  # offset of the memory's first position in ids[0]
    mem_length: int  # positions before this step's
    new: int  # positions this step writes
    result: PagedRow  # the memory after the step: the last <= keep positions
    position: int  # absolute position of the first new token (positions fed before this step)

    @property
    def ids(self) -> np.ndarray:
        return self.table.ids

    def release(self, *, result: bool = False) -> None:
        """Releases the step's hold on its table (after its forward ran), and with `result` its hold on the
        result too (a step that failed, or whose result nobody takes)."""
        self.table.release()
        if result and self.result.table is not None:
            self.result.table.release()

    @property
    def write_positions(self) -> np.ndarray:
        """Offsets, from the start of ids[0], of the positions this step writes."""
        first = self.start + self.mem_length
        return np.arange(first, first + self.new, dtype=np.int64)


def plan_row(
    pool: BlockPool, row: PagedRow, new: int, keep: int, reservation: Reservation | None = None
) -> RowStep:
    """Makes room for `new` positions after `row` (claiming, copying on write, allocating) and describes the
    step, whose memory keeps at most `keep` positions (`WindowRule.keep`). The step holds its table and its result
    one hold each (`RowStep.release`; the result's hold is the caller's once the step ran). A step that fails
    leaves what it claimed unused, and what it allocated is given back at once."""
    bs = pool.block_size
    ids = row.ids
    end = row.end
    tail_used = end % bs
    # Fresh blocks come with one reference each, held by these guards until the step's table holds its own.
    guards: list[BlockTable] = []
    try:
        if tail_used and not pool.claim(int(ids[-1]), tail_used, min(bs - tail_used, new)):
            # Something was appended after this memory's end in its last block: continue in a copy of that block.
            copy = pool.allocate(1, reservation, zero=False)  # every position written by copy_positions
            guards.append(BlockTable(pool, copy, owned=True))
            pool.copy_positions(int(ids[-1]), int(copy[0]), tail_used)
            pool.set_filled(int(copy[0]), tail_used + min(bs - tail_used, new))
            ids = np.concatenate([ids[:-1], copy])
        more = pool.blocks_for(end + new) - ids.size
        if more > 0:
            added = pool.allocate(more, reservation)
            guards.append(BlockTable(pool, added, owned=True))
            for block in added[:-1]:
                pool.set_filled(int(block), bs)
            pool.set_filled(int(added[-1]), (end + new) - (ids.size + more - 1) * bs)
            ids = np.concatenate([ids, added])
        unchanged = not guards and row.table is not None
        step_table = row.table.retain() if unchanged and row.table is not None else BlockTable(pool, ids)
    finally:
        for guard in guards:
            guard.release()
    keep = min(keep, row.length + new)
    new_start = end + new - keep
    fed = row.fed + new
    if keep == 0:
        result = PagedRow(None, fed=fed)
    else:
        drop = new_start // bs
        table = step_table.retain() if drop == 0 else BlockTable(pool, ids[drop:])
        result = PagedRow(table, new_start - drop * bs, keep, fed)
    return RowStep(step_table, row.start, row.length, new, result, row.fed)


def new_blocks(pool: BlockPool, row: PagedRow, new: int, claimed: set[int] | None = None) -> int:
    """The fresh blocks `plan_row` will take from the pool to add `new` positions after `row`: the blocks past its
    table, and a copy of its last block if another sequence already appended into it (or will, earlier in the
    same step: `claimed` collects the partly filled blocks the step's rows extend in place)."""
    bs = pool.block_size
    more = max(math.ceil((row.end + new) / bs) - row.ids.size, 0)
    tail_used = row.end % bs
    if not tail_used:
        return more
    last = int(row.ids[-1])
    extends = pool.filled(last) == tail_used
    if extends and (claimed is None or last not in claimed):
        if claimed is not None:
            claimed.add(last)
        return more
    return more + 1


def peak_blocks(mem_len: int, new: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """The most blocks one sequence's memory spans while a step of `new` positions runs on it (its memory full,
    starting at the worst offset in its first block)."""
    return math.ceil((block_size - 1 + mem_len + new) / block_size)


def resting_blocks(mem_len: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """The most blocks a memory of `mem_len` positions spans between steps."""
    return math.ceil((block_size - 1 + mem_len) / block_size) if mem_len else 0


def gather_positions(pool_tensor: Tensor, row: PagedRow, block_dim: int) -> Tensor:
    """The positions of `row` from one layer's pool tensor (blocks along `block_dim`, positions right after):
    a dense copy with the positions along `block_dim`."""
    if row.table is None or row.length == 0:
        shape = list(pool_tensor.shape)
        del shape[block_dim + 1]
        shape[block_dim] = 0
        return pool_tensor.new_zeros(shape)
    index = torch.from_numpy(row.ids).to(pool_tensor.device)
    blocks = pool_tensor.index_select(block_dim, index)  # [..., nb, bs, ...]
    flat = blocks.flatten(block_dim, block_dim + 1)  # [..., nb * bs, ...]
    return flat.narrow(block_dim, row.start, row.length)
