"""Paged memory: one forward over rows of any memory length and any number of new tokens equals running each row
alone; blocks are shared by forks, reused without leaking, and always returned to the pool."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
import torch
import txl
from txl.paged.pool import BlockPool, ReleasedError
from txl.paged.rows import PagedRow
from txl.window import WindowRule

from tests.helpers.tiny_models import tiny_model

VOCAB = 64


def _fed(model, pool, n, *, mem_len, seed):
    """A memory of one row that was fed `n` random tokens in uneven steps, and the tokens."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (1, n), generator=generator)
    memory = model.empty_memory(1, mem_len=mem_len, pool=pool)
    start = 0
    with torch.inference_mode():
        while start < n:
            size = min(n - start, 1 + (start * 7 + seed) % 9)
            before, (_, memory) = memory, model(tokens[:, start : start + size], memory)
            before.release()
            start += size
    return memory, tokens


def _alone(model, tokens, n_prior, new, *, mem_len, block_size, seed=None):
    """Log-probs of `new` after `tokens` (n_prior of them) in a pool of its own: the reference. With `seed`, the
    prior is fed exactly as `_fed` fed it (the same steps), else in one step."""
    pool = BlockPool(model.memory_layout(), block_size=block_size)
    if seed is not None:
        memory, _ = _fed(model, pool, n_prior, mem_len=mem_len, seed=seed)
    else:
        memory = model.empty_memory(1, mem_len=mem_len, pool=pool)
        if n_prior:
            with torch.inference_mode():
                _, memory = model(tokens[:, :n_prior], memory)
    with torch.inference_mode():
        hidden, memory = model(new, memory)
        return model.log_probs(hidden), memory


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("clamp_len", [1000, 3])
@pytest.mark.parametrize("queries", [1, 5])
def test_rows_of_different_lengths_step_together_as_each_alone(same_length, clamp_len, queries):
    model = tiny_model(seed=11, mem_len=13, same_length=same_length, clamp_len=clamp_len)
    pool = BlockPool(model.memory_layout(), block_size=4)
    lengths = [0, 1, 4, 7, 13, 30]  # 30 > mem_len: a memory that has slid
    memories, prefixes = [], []
    for i, n in enumerate(lengths):
        memory, tokens = _fed(model, pool, n, mem_len=13, seed=i)
        memories.append(memory)
        prefixes.append(tokens)
    new = torch.randint(0, VOCAB, (len(lengths), queries), generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        hidden, after = model(new, memories)
        batched = model.log_probs(hidden)
    for i, n in enumerate(lengths):
        expected, memory = _alone(model, prefixes[i], n, new[i : i + 1], mem_len=13, block_size=4, seed=i)
        torch.testing.assert_close(batched[i : i + 1], expected, rtol=0, atol=1e-5)
        assert after[i].length == memory.length == min(13, n + queries)
        torch.testing.assert_close(after[i].keys(1), memory.keys(1), rtol=0, atol=1e-5)


def test_ragged_rows_feed_different_numbers_of_tokens_in_one_forward():
    """forward_rows: each row its own memory length and its own number of new tokens (decode rows beside
    prompt segments), packed in one flat sequence."""
    model = tiny_model(seed=12, mem_len=20, same_length=True)
    pool = BlockPool(model.memory_layout(), block_size=4)
    lengths, queries = [0, 9, 20, 3, 9], [1, 6, 1, 6, 2]
    generator = torch.Generator().manual_seed(4)
    memories = [_fed(model, pool, n, mem_len=20, seed=10 + i) for i, n in enumerate(lengths)]
    new = [torch.randint(0, VOCAB, (q,), generator=generator) for q in queries]
    with torch.inference_mode():
        hidden, rows = model.transformer.forward_rows(
            torch.cat(new),
            queries,
            [m.rows[0] for m, _ in memories],
            [WindowRule(20, True)] * len(lengths),
            pool,
        )
        flat = model.log_probs(hidden)
    offsets = np.cumsum([0, *queries])
    for i, ((_, prefix), n) in enumerate(zip(memories, lengths, strict=True)):
        expected, memory = _alone(model, prefix, n, new[i][None, :], mem_len=20, block_size=4, seed=10 + i)
        torch.testing.assert_close(flat[offsets[i] : offsets[i + 1]], expected[0], rtol=0, atol=1e-5)
        assert rows[i].length == memory.length


def test_a_large_group_is_split_into_cache_sized_tiles_without_changing_results(monkeypatch):
    """On CPU a group of prompt segments whose scores would outgrow the cache runs as several parts: the same
    numbers as the whole group, and at most CPU_SCORE_BYTES of scores per part."""
    from txl.paged import step as paged_step

    model = tiny_model(seed=13, mem_len=20)
    pool = BlockPool(model.memory_layout(), block_size=4)
    memories = [_fed(model, pool, n, mem_len=20, seed=20 + i)[0] for i, n in enumerate([0, 5, 20, 11, 20])]
    rows, queries = [m.rows[0] for m in memories], [6] * len(memories)
    tokens = torch.randint(0, VOCAB, (sum(queries),), generator=torch.Generator().manual_seed(5))
    outputs, steps = {}, {}
    for budget in (1 << 40, 2 * model.config.n_head * 6 * 28 * 4):  # whole; two rows of 28 key slots
        monkeypatch.setattr(paged_step, "CPU_SCORE_BYTES", budget)
        rules = [WindowRule(20)] * len(rows)
        steps[budget] = paged_step.PagedStep(pool, rows, queries, rules)
        with torch.inference_mode():
            hidden, _ = model.transformer.forward_rows(tokens, queries, rows, rules, pool)
            outputs[budget] = model.log_probs(hidden)
    whole, tiled = steps.values()
    assert len(whole.groups) == 1 and [g.rows for g in tiled.groups] == [2, 2, 1]
    whole_out, tiled_out = outputs.values()
    torch.testing.assert_close(tiled_out, whole_out, rtol=0, atol=1e-5)  # float32 sums in another order


def test_a_fork_shares_blocks_and_both_branches_continue_exactly():
    model = tiny_model(seed=13, mem_len=40)
    pool = BlockPool(model.memory_layout(), block_size=4)
    parent, prefix = _fed(model, pool, 10, mem_len=40, seed=3)  # 2 full blocks and a partial one
    used = pool.used_blocks
    branches = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        # The same memory twice in one step: the first row appends in place (2 positions in the partial block,
        # 1 in a new block), the second copies the partial block (copy-on-write) and takes a new one too; both
        # share the two full blocks.
        hidden, (left, right) = model(branches, [parent, parent])
        together = model.log_probs(hidden)
    assert pool.used_blocks == used + 3
    shared = set(left.block_ids()) & set(right.block_ids())
    assert len(shared) == 2 and shared <= set(parent.block_ids())
    for i in range(2):
        expected, _ = _alone(model, prefix, 10, branches[i : i + 1], mem_len=40, block_size=4, seed=3)
        torch.testing.assert_close(together[i : i + 1], expected, rtol=0, atol=1e-5)
    with torch.inference_mode():  # both diverge further, one token at a time, still exact
        more = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(6))
        for t in range(6):
            hidden, (left, right) = model(more[:, t : t + 1], [left, right])
        last = model.log_probs(hidden)
    for i in range(2):
        tokens = torch.cat([prefix, branches[i : i + 1], more[i : i + 1, :5]], dim=1)
        expected, _ = _alone(model, tokens, 18, more[i : i + 1, 5:6], mem_len=40, block_size=4)
        torch.testing.assert_close(last[i : i + 1], expected, rtol=0, atol=1e-5)


def test_rows_enter_and_leave_between_steps_without_changing_each_others_results():
    model = tiny_model(seed=14, mem_len=12, same_length=True)
    pool = BlockPool(model.memory_layout(), block_size=4)
    generator = torch.Generator().manual_seed(8)
    streams = {i: torch.randint(0, VOCAB, (1, 30), generator=generator) for i in range(5)}
    active: dict[int, tuple[txl.Memory, int]] = {}
    outputs: dict[int, list[torch.Tensor]] = {i: [] for i in streams}
    with torch.inference_mode():
        for step in range(24):
            for i in streams:  # stream i is active during steps [2i, 2i + 16)
                if step == 2 * i:
                    active[i] = (model.empty_memory(1, mem_len=12, pool=pool), 0)
                if step == 2 * i + 16:
                    active.pop(i)[0].release()  # its blocks go back now
            ids = sorted(active)
            tokens = torch.cat([streams[i][:, active[i][1] : active[i][1] + 1] for i in ids])
            hidden, memories = model(tokens, [active[i][0] for i in ids])
            log_probs = model.log_probs(hidden)
            for row, i in enumerate(ids):
                outputs[i].append(log_probs[row])
                active[i][0].release()
                active[i] = (memories[row], active[i][1] + 1)
    for memory, _ in active.values():
        memory.release()
    for i, tokens in streams.items():
        alone = []
        memory = model.empty_memory(1, mem_len=12, pool=BlockPool(model.memory_layout(), block_size=4))
        with torch.inference_mode():
            for t in range(len(outputs[i])):
                hidden, memory = model(tokens[:, t : t + 1], memory)
                alone.append(model.log_probs(hidden)[0])
        torch.testing.assert_close(torch.cat(outputs[i]), torch.cat(alone), rtol=0, atol=1e-5)
    assert pool.used_blocks == 0 and pool.live_tables == 0


def test_a_reused_block_never_shows_its_previous_contents():
    """Blocks filled with NaN by one memory, freed, and handed to another: the new memory's results are those of
    a fresh pool (a NaN read anywhere, even masked, would poison them), and the blocks come back zeroed."""
    model = tiny_model(seed=15, mem_len=16)
    layout = model.memory_layout()
    pool = BlockPool(layout, block_size=4, blocks=9, growable=False)
    poison = {
        f"{kind}.{i}": torch.full((1, layout.n_head, 30, layout.d_head), math.nan)
        for kind in ("keys", "values")
        for i in range(layout.n_layer)
    }
    with torch.inference_mode():
        stale = txl.Memory.from_tensors(layout, poison, mem_len=32, pool=pool)
        assert pool.available_blocks == 0  # every block holds NaN now
        stale.release()
        assert pool.used_blocks == 0
        tokens = torch.randint(0, VOCAB, (1, 11), generator=torch.Generator().manual_seed(2))
        memory = model.empty_memory(1, mem_len=16, pool=pool)
        outputs = []
        for t in range(11):
            before, (hidden, memory) = memory, model(tokens[:, t : t + 1], memory)
            before.release()  # a pool of 8 blocks holds the newest memory only
            outputs.append(model.log_probs(hidden))
    expected, _ = _alone(model, tokens, 10, tokens[:, 10:], mem_len=16, block_size=4)
    torch.testing.assert_close(outputs[-1], expected, rtol=0, atol=1e-5)
    last_block = int(memory.rows[0].ids[-1])
    assert not torch.isnan(pool.keys[:, :, last_block]).any()
    assert torch.count_nonzero(pool.keys[:, :, last_block, 3:]) == 0  # past the end: zeros, not old data


def test_blocks_freed_together_come_back_lowest_first_in_ascending_order():
    """A memory allocated after others were freed gets ascending blocks (read in address order), not the freed
    batch in reverse, which made every other round of 64 decoding sessions a fifth slower."""
    model = tiny_model(seed=17, mem_len=8)
    pool = BlockPool(model.memory_layout(), block_size=4, blocks=64)
    first = [pool.allocate(5) for _ in range(3)]
    assert np.concatenate(first).tolist() == list(range(1, 16))
    for ids in first:
        pool.decref(ids)
    again = pool.allocate(8)
    assert again.tolist() == list(range(1, 9))
    pool.decref(again[::2])  # holes: 1, 3, 5, 7 free again, beside 9.. never used
    assert pool.allocate(6).tolist() == [1, 3, 5, 7, 9, 10]


def test_a_thousand_memories_come_and_go_without_leaking_a_block():
    model = tiny_model(seed=16, mem_len=8)
    pool = BlockPool(model.memory_layout(), block_size=4)
    generator = torch.Generator().manual_seed(1)
    live: list[txl.Memory] = []
    with torch.inference_mode():
        for i in range(1000):
            memory = model.empty_memory(1, mem_len=i % 12, pool=pool)
            _, memory = model(torch.randint(0, VOCAB, (1, 1 + i % 5), generator=generator), memory)
            if i % 3 == 0:
                _, fork = model(torch.randint(0, VOCAB, (1, 2), generator=generator), memory)
                live.append(fork)
            live.append(memory)
            if len(live) > 20:
                for gone in live[:-7]:
                    gone.release()
                live = live[-7:]
    assert pool.used_blocks > 0
    for memory in live:
        memory.release()
    assert pool.used_blocks == 0 and pool.available_blocks == pool.capacity and pool.live_tables == 0


def test_a_released_memory_gives_its_blocks_back_at_once_and_only_its_own():
    """No garbage collector is involved: the blocks a memory alone holds are free the moment it is released, the
    ones another memory shares stay until that one is released too, and releasing twice changes nothing."""
    model = tiny_model(seed=18, mem_len=16)
    pool = BlockPool(model.memory_layout(), block_size=4)
    gc.disable()
    try:
        parent, _ = _fed(model, pool, 10, mem_len=8, seed=4)  # the child slides past its first block
        with torch.inference_mode():
            _, child = model(torch.zeros((1, 5), dtype=torch.long), parent)
        kept = pool.used_blocks
        shared = set(parent.block_ids().tolist()) & set(child.block_ids().tolist())
        assert shared and pool.live_tables > 0
        parent.release()
        assert pool.used_blocks == child.block_ids().size < kept  # the parent's own blocks came back now
        parent.release()  # idempotent
        assert pool.used_blocks == child.block_ids().size
        held = child.retain()  # a second owner: one release is not the last
        child.release()
        assert pool.used_blocks == held.block_ids().size
        held.release()
        assert pool.used_blocks == 0 and pool.live_tables == 0
        with pytest.raises(ReleasedError):
            held.retain()  # nothing holds its blocks any more: they may be another sequence's
    finally:
        gc.enable()


def test_a_step_that_fails_gives_back_what_it_took_at_once():
    model = tiny_model(seed=19, mem_len=8)
    pool = BlockPool(model.memory_layout(), block_size=4, blocks=4, growable=False)  # 3 usable blocks
    with torch.inference_mode():
        _, first = model(torch.zeros((1, 5), dtype=torch.long), model.empty_memory(1, pool=pool))  # 2 blocks
        used = pool.used_blocks
        # Two rows: the first takes the last free block, the second finds none.
        with pytest.raises(txl.PoolExhausted):
            model(torch.zeros((2, 4), dtype=torch.long), [model.empty_memory(1, pool=pool), first])
    assert pool.used_blocks == used and pool.live_tables == 1
    first.release()
    assert pool.used_blocks == 0


def test_a_reservation_gives_back_what_it_did_not_use_when_its_block_ends():
    model = tiny_model(seed=17, mem_len=8)
    pool = BlockPool(model.memory_layout(), block_size=4, blocks=5, growable=False)
    with pool.reserve(3) as reservation:
        pool.decref(pool.allocate(1, reservation))
        assert pool.available_blocks == 4 - 2
    assert pool.available_blocks == 4 and reservation.remaining == 0


def test_a_pool_that_may_not_grow_refuses_and_reservations_hold_room():
    model = tiny_model(seed=17, mem_len=8)
    pool = BlockPool(model.memory_layout(), block_size=4, blocks=5, growable=False)  # 4 usable blocks
    reservation = pool.reserve(3)
    assert pool.available_blocks == 1
    with torch.inference_mode(), pytest.raises(txl.PoolExhausted):
        model(torch.zeros((1, 12), dtype=torch.long), model.empty_memory(1, pool=pool))
    assert pool.used_blocks == 0  # the failed step kept nothing
    blocks = pool.allocate(3, reservation)
    assert pool.available_blocks == 1 and reservation.remaining == 0
    pool.decref(blocks)
    reservation.release()
    assert pool.available_blocks == 4


def test_a_copy_in_another_pool_reads_the_same_and_carries_nothing_else():
    model = tiny_model(seed=18, mem_len=10)
    source = BlockPool(model.memory_layout(), block_size=4)
    memory, _ = _fed(model, source, 23, mem_len=10, seed=7)  # slid: starts mid-block
    target = BlockPool(model.memory_layout(), block_size=4)
    copy = memory.to_pool(target)
    assert copy.rows[0].start == memory.rows[0].start != 0
    for i in range(model.config.n_layer):
        torch.testing.assert_close(copy.keys(i), memory.keys(i), rtol=0, atol=0)
    first = copy.block_ids()[0]
    assert torch.count_nonzero(target.keys[:, :, first, : copy.rows[0].start]) == 0
    new = torch.randint(0, VOCAB, (1, 3), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected, _ = model(new, memory)
        got, _ = model(new, copy)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_an_empty_row_and_a_zero_mem_len_keep_no_blocks():
    model = tiny_model(seed=19, mem_len=0)
    pool = BlockPool(model.memory_layout(), block_size=4)
    with torch.inference_mode():
        _, memory = model(torch.zeros((2, 6), dtype=torch.long), model.empty_memory(2, mem_len=0, pool=pool))
    assert memory.rows == (PagedRow(None, fed=6), PagedRow(None, fed=6)) and pool.used_blocks == 0


def test_a_released_pool_holds_no_memory_and_refuses_to_be_used():
    model = tiny_model()
    pool = BlockPool(model.memory_layout(), block_size=4, blocks=16)
    memory = model.empty_memory(1, mem_len=8, pool=pool)
    blocks = pool.n_blocks
    pool.release()
    assert pool.keys.device.type == "meta" and pool.values.device.type == "meta"
    assert pool.n_blocks == blocks  # sizes still read (metrics, reports)
    with pytest.raises((RuntimeError, NotImplementedError)):
        model(torch.tensor([[1, 2]]), memory=memory)


# counted one by one up to paged.SMALL_TABLE, then by numpy
@pytest.mark.parametrize("size", [1, 3, 8, 9, 40])
def test_reference_counts_count_each_id_of_a_table_repeats_included(size):
    pool = BlockPool(tiny_model(seed=1).memory_layout(), block_size=4, blocks=64)
    rng = np.random.default_rng(size)
    held = pool.allocate(20)
    ids = rng.choice(held, size=size)  # repeats: a table may list a block twice
    expected = {int(b): 1 + int((ids == b).sum()) for b in held}
    pool.incref(ids)
    assert {int(b): pool.refcount(int(b)) for b in held} == expected
    pool.decref(ids)
    assert {int(b): pool.refcount(int(b)) for b in held} == dict.fromkeys(expected, 1)
    pool.incref(ids)
    pool.decref(held)
    pool.decref(ids)  # the last references go, repeats included: each block is freed once
    assert pool.used_blocks == 0 and sorted(pool._free) == sorted(set(pool._free))
