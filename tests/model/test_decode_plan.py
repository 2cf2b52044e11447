"""Planning a decoding step for many rows at once (txl.paged.decode_plan) against `plan_row` on each row in turn.

Twin pools are driven through the same history (sessions that grow, fork, share a partly written block, slide
past their window, or hold nothing), then one pool plans the step row by row and the other all at once. Fresh
blocks may get other ids; everything else must be the same: each row's step (its table, where its new position
goes) and its memory after the step, every block's reference count and mark.
"""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest
from txl.kernels.cpu.plan_marks import cpu_plan_marks
from txl.paged import decode_plan
from txl.paged.decode_plan import DecodePlan, plan_decode
from txl.paged.pool import BlockPool, BlockTable
from txl.paged.rows import PagedRow, RowStep, plan_row
from txl.window import WindowRule, keeps_after, windows_at

from tests.helpers.tiny_models import tiny_model

BLOCK = 4


def _history(pool: BlockPool, seed: int, steps: list[RowStep] | None = None) -> list[PagedRow]:
    """Rows of a random history: new sessions, steps of random sizes, forks of older versions, empty rows (each
    step made goes to `steps`, holding its table and its result; without, they are kept to the pool's end)."""
    made: list[RowStep] = [] if steps is None else steps
    rng = random.Random(seed)
    rows: list[PagedRow] = [PagedRow(None, fed=0)]
    for _ in range(40):
        base = rng.choice(rows)
        new = rng.choice([1, 1, 1, 2, 3, 4, 5, 9])
        keep = rng.choice([0, 3, 6, 8, 11, 100])
        made.append(plan_row(pool, base, new, keep))
        rows.append(made[-1].result)
    return [rng.choice(rows) for _ in range(rng.randint(1, 40))]


def _state(pool: BlockPool, ids: np.ndarray) -> list[tuple[int, int]]:
    return [(pool.refcount(int(b)), int(pool._filled[b])) for b in ids]


@pytest.fixture(params=[True, False], ids=["native", "arrays"])
def native(request, monkeypatch) -> bool:
    """Rows placed by kernels/cpu/plan_marks.c (where a C compiler exists), and by numpy's array operations."""
    if request.param and cpu_plan_marks() is None:
        pytest.skip("no C compiler: plan_marks.c cannot be built")
    monkeypatch.setattr(decode_plan, "NATIVE", request.param)
    return request.param


def test_the_native_call_is_built_where_a_c_compiler_is():
    assert (cpu_plan_marks() is not None) == (
        shutil.which("cc") is not None or shutil.which("gcc") is not None
    )


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("few_rows", [0, 1000])  # every step through the arrays, and every step row by row
def test_planning_rows_together_is_planning_them_one_by_one(seed, few_rows, native, monkeypatch):
    monkeypatch.setattr(decode_plan, "FEW_ROWS", few_rows)
    layout = tiny_model(seed=1).memory_layout()
    pools = [BlockPool(layout, block_size=BLOCK, blocks=8) for _ in range(2)]
    made: list[list[RowStep]] = [[], []]
    histories = [_history(pool, seed, steps) for pool, steps in zip(pools, made)]  # the same block ids
    handed_out = [pool._incarnations.copy() for pool in pools]
    rng = random.Random(seed + 100)
    keeps = np.array([rng.choice([0, 1, 2, 3, 5, 8, 100]) for _ in histories[0]], dtype=np.int64)

    one_by_one = DecodePlan.of_row_steps(
        [plan_row(pools[0], row, 1, int(k)) for row, k in zip(histories[0], keeps, strict=True)]
    )
    together = plan_decode(pools[1], histories[1], keeps)

    def fresh(pool: int, block: int) -> bool:
        """Handed out while the step was planned."""
        before = handed_out[pool]
        return block >= before.size or pools[pool]._incarnations[block] != before[block]

    pairs: dict[int, int] = {}  # a block of the first pool -> the second pool's block in its place

    def same_blocks(a: np.ndarray, b: np.ndarray) -> None:
        assert a.size == b.size
        for x, y in zip(a.tolist(), b.tolist(), strict=True):
            assert x == y or (fresh(0, x) and fresh(1, y))
            assert pairs.setdefault(x, y) == y

    assert len(one_by_one) == len(together) == len(histories[0])
    for field in ("widths", "starts", "key_lengths", "positions", "write_slots"):
        np.testing.assert_array_equal(getattr(one_by_one, field), getattr(together, field), err_msg=field)
    same_blocks(one_by_one.flat_ids, together.flat_ids)
    same_blocks(one_by_one.write_blocks, together.write_blocks)
    for a, b in zip(one_by_one.results, together.results, strict=True):
        assert (a.start, a.length, a.fed) == (b.start, b.length, b.fed)
        same_blocks(a.ids, b.ids)
    assert len(set(pairs.values())) == len(pairs)  # one block for one
    assert pools[0].used_blocks == pools[1].used_blocks and pools[0].n_blocks == pools[1].n_blocks
    every = np.arange(1, pools[0].n_blocks)
    assert _state(pools[0], every) == _state(pools[1], np.array([pairs.get(b, b) for b in every.tolist()]))
    # Releasing the plans, their results and the history gives every block back in both pools alike.
    one_by_one.release(results=True)
    together.release(results=True)
    for steps in made:
        for rs in steps:
            rs.release(result=True)
    assert pools[0].used_blocks == pools[1].used_blocks == 0
    assert pools[0].live_tables == pools[1].live_tables == 0


def test_rows_ending_in_one_block_at_its_mark_extend_it_once_and_copy_it_after(native):
    """Two forks of one memory, whose last block is partly written: the first in order appends in place, the
    second continues in a copy, as `plan_row` would have it."""
    layout = tiny_model(seed=1).memory_layout()
    pool = BlockPool(layout, block_size=BLOCK, blocks=16)
    row = plan_row(pool, PagedRow(None, fed=0), 6, 100).result  # 6 positions: one block and a half
    decode_plan.FEW_ROWS, saved = 0, decode_plan.FEW_ROWS
    try:
        plan = plan_decode(pool, [row, row, row], np.array([100, 100, 100]))
    finally:
        decode_plan.FEW_ROWS = saved
    last = int(row.ids[-1])
    assert plan.write_blocks[0] == last and plan.write_blocks[1] != last and plan.write_blocks[2] != last
    assert plan.write_blocks[1] != plan.write_blocks[2]
    assert list(plan.write_slots) == [2, 2, 2] and pool._filled[last] == 3
    assert [r.length for r in plan.results] == [7, 7, 7]


@pytest.mark.parametrize("same_length", [False, True])
def test_window_arrays_are_the_rules_row_by_row(same_length):
    rng = random.Random(3)
    rules = [
        WindowRule(rng.choice([0, 1, 5, 16]), same_length, rng.choice([None, 1, 4, 7])) for _ in range(200)
    ]
    fed = np.array([rng.randint(0, 100) for _ in rules], dtype=np.int64)
    mem_lens = np.array([r.mem_len for r in rules], dtype=np.int64)
    grids = np.array([r.grid or 0 for r in rules], dtype=np.int64)
    assert keeps_after(mem_lens, grids, same_length, fed).tolist() == [
        r.keep(int(f)) for r, f in zip(rules, fed, strict=True)
    ]
    assert windows_at(mem_lens, grids, same_length, fed).tolist() == [
        r.window(int(f)) for r, f in zip(rules, fed, strict=True)
    ]


def test_a_plan_holds_the_blocks_its_step_reads_until_it_is_released():
    layout = tiny_model(seed=1).memory_layout()
    pool = BlockPool(layout, block_size=BLOCK, blocks=16)
    first = plan_row(pool, PagedRow(None, fed=0), 8, 100)  # two full blocks: the step starts a third
    first.release()
    row = first.result
    decode_plan.FEW_ROWS, saved = 0, decode_plan.FEW_ROWS
    try:
        plan = plan_decode(pool, [row], np.array([4]))  # keeps 4: the result drops the first two blocks
    finally:
        decode_plan.FEW_ROWS = saved
    assert plan.widths.tolist() == [3] and len(plan.results[0].ids) == 2
    assert row.table is not None
    row.table.release()
    assert pool.used_blocks == 3  # the step's table still holds all three
    result = plan.results[0]
    plan.release()
    assert pool.used_blocks == 2 and isinstance(result.table, BlockTable)  # released, at once
    result.table.release()
    assert pool.used_blocks == 0 and pool.live_tables == 0
    del result
    assert pool.used_blocks == 0


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_going_on_plans_the_same_from_the_arrays_its_last_step_left(seed, native, monkeypatch):
    """Twin pools run the same rows step after step: one reads every step's rows back from the row objects, the
    other from the previous plan's `after` (a persistent batch). Their plans, results and pools stay the same,
    through rows that start blocks, slide past their window, share a block at its mark, or keep nothing."""
    monkeypatch.setattr(decode_plan, "FEW_ROWS", 0)
    layout = tiny_model(seed=1).memory_layout()
    pools = [BlockPool(layout, block_size=BLOCK, blocks=8) for _ in range(2)]
    made: list[list[RowStep]] = [[], []]
    rows = [_history(pool, seed, steps) for pool, steps in zip(pools, made)]
    rng = random.Random(seed + 200)
    keeps_per_row = [rng.choice([0, 1, 3, 5, 8, 11, 100]) for _ in rows[0]]
    after = None
    for step in range(12):
        fed = np.array([row.fed for row in rows[0]], dtype=np.int64)
        keeps = np.minimum(fed + 1, np.array(keeps_per_row, dtype=np.int64))
        read = plan_decode(pools[0], rows[0], keeps.copy())
        carried = plan_decode(pools[1], rows[1], keeps.copy(), after)
        for field in (
            "flat_ids",
            "widths",
            "starts",
            "key_lengths",
            "positions",
            "write_blocks",
            "write_slots",
        ):
            np.testing.assert_array_equal(
                getattr(read, field), getattr(carried, field), err_msg=f"{step} {field}"
            )
        for a, b in zip(read.results, carried.results, strict=True):
            assert (a.start, a.length, a.fed) == (b.start, b.length, b.fed)
            np.testing.assert_array_equal(a.ids, b.ids)
        assert carried.after is not None
        expect = [r.ids for r in carried.results]
        assert [a.tolist() for a in carried.after.ids] == [a.tolist() for a in expect]
        np.testing.assert_array_equal(carried.after.widths, [a.size for a in expect])
        np.testing.assert_array_equal(carried.after.lasts, [a[-1] if a.size else 0 for a in expect])
        np.testing.assert_array_equal(carried.after.starts, [r.start for r in carried.results])
        np.testing.assert_array_equal(carried.after.lengths, [r.length for r in carried.results])
        np.testing.assert_array_equal(carried.after.fed, [r.fed for r in carried.results])
        every = np.arange(1, pools[0].n_blocks)
        assert pools[0].n_blocks == pools[1].n_blocks and _state(pools[0], every) == _state(pools[1], every)
        for plan in (read, carried):
            plan.release()
        if step:  # the last step's results, which these plans read: released as a batch going on does
            for row in [*rows[0], *rows[1]]:
                if row.table is not None:
                    row.table.release()
        rows = [read.results, carried.results]
        after = carried.after
    for row in [*rows[0], *rows[1]]:
        if row.table is not None:
            row.table.release()
    for rs in [*made[0], *made[1]]:
        rs.release(result=True)
    assert pools[0].used_blocks == pools[1].used_blocks == 0


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("mem_len", [0, 1, 5, 16])
@pytest.mark.parametrize("grid", [None, 1, 4, 7])
def test_one_rule_for_every_row_given_as_integers_is_the_rule(same_length, mem_len, grid):
    rule = WindowRule(mem_len, same_length, grid)
    fed = np.arange(0, 60, dtype=np.int64)
    keeps = keeps_after(mem_len, grid or 0, same_length, fed)
    windows = windows_at(mem_len, grid or 0, same_length, fed)
    assert keeps.shape == windows.shape == fed.shape
    assert keeps.tolist() == [rule.keep(int(f)) for f in fed]
    assert windows.tolist() == [rule.window(int(f)) for f in fed]
