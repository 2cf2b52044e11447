"""Planning one decoding step (one new position per row) for many rows at once.

`plan_row` makes room for a row's new positions one row at a time: a claim on its last block under the pool's
lock, a step table, a result row. For a decoding step of 64 rows that is most of the host's time around a
captured graph (`python -m bench host`). Almost every decoding row is in the same case: its memory ends inside
its last block, at that block's mark, so the new position is appended in place and the row's table is reused as
is. Here that case is decided for every row with array operations (one pass under the lock); the rows in any
other case (a new block to allocate, a copy on write, no memory yet) go through `plan_row`, in the same order,
so the pool ends in the same state and each row's step and result are the ones `plan_row` alone would give
(tests/model/test_decode_plan.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..kernels.cpu.plan_marks import Marks, RowEnds, cpu_plan_marks
from .pool import BlockPool, BlockTable, retain_all
from .rows import PagedRow, RowStep, plan_row

_NO_IDS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class RowArrays:
    """The rows a plan leaves (its `results`), as the next plan of the same rows reads them: a decoding batch
    goes on with the same rows step after step, and reading them back from every row object was a large share of
    the planning (docs/model.md). Numbers only: block ids here hold no reference to their blocks."""

    starts: np.ndarray  # [n] offset of each row's first position in its first block
    lengths: np.ndarray  # [n] positions held
    fed: np.ndarray  # [n] positions fed
    widths: np.ndarray  # [n] blocks in each row's table
    lasts: np.ndarray  # [n] each table's last block (0: no table)
    ids: list[np.ndarray]  # each table's block ids


@dataclass(frozen=True)
class DecodePlan:
    """Where each row's new position goes and what its attention reads, as arrays over the rows."""

    # The block ids each row's attention reads (its memory and the new position), concatenated: row i's are
    # widths[i] ids, after those of the rows before it.
    flat_ids: np.ndarray
    widths: np.ndarray  # [n]
    starts: np.ndarray  # [n] offset of each row's first position in its first block
    key_lengths: np.ndarray  # [n] positions the new token's query sees: the memory and itself
    positions: np.ndarray  # [n] absolute position of each new token (positions fed before it)
    write_blocks: np.ndarray  # [n] the block each new position is written to
    write_slots: np.ndarray  # [n] its slot in that block
    results: list[PagedRow]  # each row's memory after the step
    # The step's own holds on the tables its rows read where they changed (a fresh block, a copy): released when
    # the step has run (`release`). Each of `results` holds its table once more, for the caller.
    keep_alive: list[BlockTable]
    # The results as arrays, for the next step of the same rows (`plan_decode(previous=...)`); None when planned
    # row by row.
    after: RowArrays | None = None

    def __len__(self) -> int:
        return len(self.results)

    def release(self, *, results: bool = False) -> None:
        """The step's holds go (it has run); with `results`, the results' holds too (nobody takes them)."""
        for table in self.keep_alive:
            table.release()
        self.keep_alive.clear()
        if results:
            for row in self.results:
                if row.table is not None:
                    row.table.release()

    @classmethod
    def of_row_steps(cls, steps: Sequence[RowStep]) -> DecodePlan:
        """The plan of rows planned one by one (`plan_row`, one new position each)."""
        if any(rs.new != 1 for rs in steps):
            raise ValueError("a decoding plan feeds one new position per row")
        bs = steps[0].table.pool.block_size if steps else 1
        # In Python numbers: for the few rows this is used for, a handful of numpy calls cost more than the rows.
        at = [rs.start + rs.mem_length for rs in steps]  # each new position's offset in its table
        return cls(
            np.concatenate([rs.ids for rs in steps]) if steps else _NO_IDS,
            np.array([rs.ids.size for rs in steps], dtype=np.int64),
            np.array([rs.start for rs in steps], dtype=np.int64),
            np.array([rs.mem_length + 1 for rs in steps], dtype=np.int64),
            np.array([rs.position for rs in steps], dtype=np.int64),
            np.array([rs.ids[a // bs] for rs, a in zip(steps, at, strict=True)], dtype=np.int64),
            np.array([a % bs for a in at], dtype=np.int64),
            [rs.result for rs in steps],
            [rs.table for rs in steps],
        )


def _marks(bs: int, rows: RowEnds, filled: np.ndarray, keeps: np.ndarray) -> Marks:
    """Where each row's new position goes, as array operations (the contract of kernels/cpu/plan_marks.c, which
    does it in one call where it can be built); `filled` is the pool's marks, under its lock."""
    starts, lengths, widths, lasts, fed = rows
    ends = starts + lengths
    tails = ends % bs
    fits = (ends + bs - 1) // bs == widths  # the memory ends in its table's last block (no block past it)
    # Appends in place: the memory ends inside its last block, at the block's mark (nothing written after it).
    in_place = fits & (tails > 0) & (filled[lasts] == tails)
    at = np.flatnonzero(in_place)
    ending = np.sort(lasts[at])
    if (ending[1:] == ending[:-1]).any():
        # Rows ending in the same block at its mark: the first in order extends it, the others copy it.
        in_place[:] = False
        at = at[np.unique(lasts[at], return_index=True)[1]]
        in_place[at] = True
    filled[lasts[at]] = tails[at] + 1
    # The memory fills its last block exactly (or there is none): the new position starts a fresh block.
    starts_block = fits & (tails == 0)
    planned = ~(in_place | starts_block)  # any other case: `plan_row`
    keeps = np.minimum(keeps, lengths + 1)
    new_starts = ends + 1 - keeps
    drops = np.where(keeps > 0, new_starts // bs, 0)
    return Marks(
        tails,
        drops,
        np.where(keeps > 0, new_starts - drops * bs, 0),
        fed + 1,
        np.flatnonzero(starts_block),
        np.flatnonzero(planned).tolist(),
        np.flatnonzero((drops > 0) & ~planned),
        np.flatnonzero(keeps == 0),
        keeps,
    )


# Where each row's new position goes is decided in one native call where it can be built
# (kernels/cpu/plan_marks.c), else by `_marks`; tests turn it off to run both.
NATIVE = True

# Up to this many rows a step is planned row by row (`plan_row`): array operations cost a few microseconds each
# whatever their length, and for a handful of rows there are more of them than there is work.
FEW_ROWS = 24


def plan_decode(
    pool: BlockPool, rows: Sequence[PagedRow], keeps: np.ndarray, previous: RowArrays | None = None
) -> DecodePlan:
    """Makes room for one new position after each of `rows` and plans the step; row i's memory keeps at most
    `keeps[i]` positions after it (`WindowRule.keep`). Each row's step and result are those of `plan_row` on the
    rows in turn, and the pool's reference counts and marks end the same (fresh blocks may get other ids).

    `previous`: the `after` of the plan whose `results` are exactly `rows`, in order (the caller checks it: the
    same row objects); their numbers are then taken from it instead of read from each row. It is used up (its
    arrays change): pass each `after` once."""
    n, bs = len(rows), pool.block_size
    if n <= FEW_ROWS:
        steps: list[RowStep] = []
        try:
            with pool.zeroing_together():
                for row, keep in zip(rows, keeps.tolist(), strict=True):
                    steps.append(plan_row(pool, row, 1, keep))
        except BaseException:  # what was taken so far goes back at once
            for rs in steps:
                rs.release(result=True)
            raise
        return DecodePlan.of_row_steps(steps)
    tables: list[BlockTable | None] = [row.table for row in rows]
    if previous is not None:
        ids = list(previous.ids)
        starts, lengths, fed = previous.starts, previous.lengths, previous.fed
        widths, lasts = previous.widths, previous.lasts  # changed in place below: `previous` is used up
    else:
        ids = [t.ids if t is not None else _NO_IDS for t in tables]
        starts = np.fromiter((row.start for row in rows), dtype=np.int64, count=n)
        lengths = np.fromiter((row.length for row in rows), dtype=np.int64, count=n)
        fed = np.fromiter((row.fed for row in rows), dtype=np.int64, count=n)
        widths = np.fromiter((a.size for a in ids), dtype=np.int64, count=n)
        flat = np.concatenate(ids)
        bounds = np.cumsum(widths)  # where each row's ids end in `flat`
        lasts = np.where(widths > 0, flat[bounds - 1], 0) if flat.size else np.zeros(n, dtype=np.int64)
    native = cpu_plan_marks() if NATIVE else None
    with pool.fill_marks() as filled:
        marks = (native or _marks)(bs, RowEnds(starts, lengths, widths, lasts, fed), filled, keeps)
    keeps, drops, planned = marks.keeps, marks.drops, marks.planned
    write_blocks, write_slots = lasts, marks.slots
    keep_alive: list[BlockTable] = []
    plans: dict[int, RowStep] = {}
    try:
        with pool.zeroing_together():
            fresh_rows = marks.fresh
            if fresh_rows.size:
                fresh = pool.allocate(
                    fresh_rows.size
                )  # one reference each, which the step's table takes over
                pool.set_filled(fresh, 1)
                write_blocks[fresh_rows] = fresh
                widths[fresh_rows] += 1
                # The step's tables: one reference more to the memory's blocks, the fresh block's own.
                extended = fresh_rows.tolist()
                memory_ids = [ids[i] for i in extended]
                pool.incref(np.concatenate(memory_ids))
                # Each is its memory's ids and the fresh block: views of one array made in one concatenation
                # (np.append row by row is slower).
                pieces: list[np.ndarray] = []
                for j, old in enumerate(memory_ids):
                    pieces += (old, fresh[j : j + 1])
                joined = np.concatenate(pieces)
                end = 0
                for i, old in zip(extended, memory_ids, strict=True):
                    start, end = end, end + old.size + 1
                    ids[i] = joined[start:end]
                    step_table = tables[i] = BlockTable(pool, ids[i], owned=True)
                    keep_alive.append(step_table)
            for i in planned:
                rs = plans[i] = plan_row(pool, rows[i], 1, int(keeps[i]))
                keep_alive.append(rs.table)
                ids[i] = rs.ids
                position = rs.start + rs.mem_length
                write_blocks[i] = rs.ids[position // bs]
                write_slots[i] = position % bs
    except BaseException:  # what was taken so far goes back at once
        for table in keep_alive:
            table.release()
        for rs in plans.values():
            if rs.result.table is not None:
                rs.result.table.release()
        raise
    if planned:  # their tables changed in any way
        widths = np.fromiter((a.size for a in ids), dtype=np.int64, count=n)
    if previous is not None or planned or fresh_rows.size:  # one concatenation (np.insert costs more)
        flat = np.concatenate(ids)
    # The memory after the step: the last `keep` positions, without the blocks before them.
    dropping = marks.dropping
    ids_after, widths_after = list(ids), widths.copy()  # each result's table: the step's, but for these
    if dropping.size:
        drop_list = drops[dropping].tolist()
        kept = [ids[i][d:] for i, d in zip(dropping.tolist(), drop_list, strict=True)]
        pool.incref(np.concatenate(kept))
        for i, a in zip(dropping.tolist(), kept, strict=True):
            tables[i] = BlockTable(pool, a, owned=True)
            ids_after[i] = a
        widths_after[dropping] -= drops[dropping]
    emptied = marks.emptied
    for i in emptied.tolist():
        tables[i] = None
        ids_after[i] = _NO_IDS
    widths_after[emptied] = 0
    starts_after, fed_after = marks.starts_after, marks.fed_after
    # A result whose table is the step's or its memory's (no block dropped) holds it once more, for the caller.
    sharing = np.ones(n, dtype=bool)
    sharing[dropping] = False
    sharing[emptied] = False
    sharing[planned] = False
    retain_all(pool, [tables[i] for i in np.flatnonzero(sharing).tolist()])
    results = list(map(PagedRow, tables, starts_after.tolist(), keeps.tolist(), fed_after.tolist()))
    lasts_after = np.where(keeps > 0, write_blocks, 0)  # a kept row's last block: where its new position went
    for i, rs in plans.items():
        results[i] = row = rs.result
        ids_after[i] = row.ids
        widths_after[i] = row.ids.size
    after = RowArrays(starts_after, keeps, fed_after, widths_after, lasts_after, ids_after)
    return DecodePlan(
        flat, widths, starts, lengths + 1, fed, write_blocks, write_slots, results, keep_alive, after
    )
