"""Windows on an absolute segment grid: a memory, and everything that follows it, is a function of its tokens
alone, however they were cut into steps (txl.window)."""

from __future__ import annotations

import itertools

import pytest
import torch
import txl
from txl.window import UNBOUNDED, WindowRule

from tests.helpers.tiny_models import tiny_model

VOCAB = 64


def test_the_rule_keeps_what_the_next_window_reaches():
    rule = WindowRule(10, grid=4)
    # A query at position 13 (offset 1 in the grid segment starting at 12) sees 12 - 10 = 2 .. 13: 12 keys.
    assert rule.window(13) == 12 and rule.window(12) == 11 and rule.window(15) == 14
    assert [rule.keep(fed) for fed in (0, 3, 12, 13, 15, 16)] == [0, 3, 10, 11, 13, 10]
    assert rule.max_positions == 13
    assert WindowRule(10).window(99) == UNBOUNDED and WindowRule(10).keep(99) == 10
    same = WindowRule(10, same_length=True, grid=4)
    assert same.window(13) == 10 and same.keep(13) == 10 and same.max_positions == 10
    assert WindowRule(0, same_length=True).window(5) == 1  # a query always sees itself


def _feed(model, tokens, cuts, *, mem_len, grid, pool):
    """Feeds `tokens` [1, N] cut before each index in `cuts`; returns the log-probs of every position and the
    memory."""
    memory = model.empty_memory(1, mem_len=mem_len, pool=pool, grid=grid)
    bounds = [0, *cuts, tokens.size(1)]
    outputs = []
    with torch.inference_mode():
        for lo, hi in itertools.pairwise(bounds):
            if hi > lo:
                hidden, memory = model(tokens[:, lo:hi], memory)
                outputs.append(model.log_probs(hidden))
    return torch.cat(outputs, dim=1), memory


@pytest.mark.parametrize("same_length", [False, True], ids=["grid", "same_length"])
@pytest.mark.parametrize("mem_len", [0, 5, 13])
def test_any_cut_of_a_text_gives_the_same_log_probs_and_memory(same_length, mem_len):
    model = tiny_model(seed=31, mem_len=mem_len, same_length=same_length, clamp_len=1000)
    pool = txl.BlockPool(model.memory_layout(), block_size=4)
    grid = model.config.segment_len  # 8
    generator = torch.Generator().manual_seed(mem_len)
    tokens = torch.randint(0, VOCAB, (1, 61), generator=generator)
    whole, memory = _feed(model, tokens, [], mem_len=mem_len, grid=grid, pool=pool)
    cuts_tried = [list(range(1, 61)), [3, 4, 21, 22, 23, 40], [8, 16, 24, 32, 40, 48, 56]]
    for _ in range(2):
        cuts_tried.append(sorted(torch.randperm(60, generator=generator)[:7].add(1).tolist()))
    for cuts in cuts_tried:
        got, other = _feed(model, tokens, cuts, mem_len=mem_len, grid=grid, pool=pool)
        torch.testing.assert_close(got, whole, rtol=0, atol=1e-5)
        assert other.length == memory.length == WindowRule(mem_len, same_length, grid).keep(61)
        for layer in range(model.config.n_layer):
            torch.testing.assert_close(other.keys(layer), memory.keys(layer), rtol=0, atol=1e-5)


def test_without_the_grid_windows_follow_the_cuts():
    """HF's function (grid None) depends on where segments start: the reason for the grid."""
    model = tiny_model(seed=32, mem_len=5, same_length=False)
    pool = txl.BlockPool(model.memory_layout(), block_size=4)
    tokens = torch.randint(0, VOCAB, (1, 30), generator=torch.Generator().manual_seed(1))
    whole, _ = _feed(model, tokens, [], mem_len=5, grid=None, pool=pool)
    cut, _ = _feed(model, tokens, [11], mem_len=5, grid=None, pool=pool)
    assert float((whole - cut).abs().max()) > 1e-3


def test_a_fork_and_a_shorter_mem_len_keep_the_rule():
    model = tiny_model(seed=33, mem_len=9)
    pool = txl.BlockPool(model.memory_layout(), block_size=4)
    tokens = torch.randint(0, VOCAB, (1, 27), generator=torch.Generator().manual_seed(2))
    _, memory = _feed(model, tokens[:, :20], [], mem_len=9, grid=8, pool=pool)
    both = txl.Memory.stack([memory, memory])  # a fork: the same memory twice, blocks shared
    with torch.inference_mode():
        hidden, _ = model(tokens[:, 20:].expand(2, -1), both)
        got = model.log_probs(hidden)
    expected, _ = _feed(model, tokens, [], mem_len=9, grid=8, pool=pool)
    torch.testing.assert_close(got, expected[:, 20:].expand(2, -1, -1), rtol=0, atol=1e-5)
    shorter = memory.with_mem_len(4)
    assert shorter.grid == 8 and shorter.length == 4 + 20 % 8 and shorter.fed == [20]
