"""Caching is exact: the memory gives the same results however the text is cut into steps."""

from __future__ import annotations

import pytest
import torch
import txl
from txl.paged.rows import peak_blocks, resting_blocks

from tests.helpers.tiny_models import tiny_model

SEQ = 40


def _log_probs_in_steps(model, tokens, step_sizes, mem_len=None):
    memory = model.empty_memory(tokens.size(0), mem_len=mem_len)
    out, start = [], 0
    with torch.inference_mode():
        for size in step_sizes:
            hidden, memory = model(tokens[:, start : start + size], memory)
            out.append(model.log_probs(hidden))
            start += size
    assert start == tokens.size(1)
    return torch.cat(out, dim=1), memory


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1, mem_len=SEQ, same_length=False)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 64, (2, SEQ), generator=torch.Generator().manual_seed(0))


def test_token_by_token_segments_and_one_pass_agree(model, tokens):
    one_pass, _ = _log_probs_in_steps(model, tokens, [SEQ])
    by_token, _ = _log_probs_in_steps(model, tokens, [1] * SEQ)
    by_seven, _ = _log_probs_in_steps(model, tokens, [7] * 5 + [5])
    torch.testing.assert_close(by_token, one_pass, rtol=0, atol=1e-5)
    torch.testing.assert_close(by_seven, one_pass, rtol=0, atol=1e-5)


def test_same_length_model_is_segmentation_invariant_with_a_sliding_window():
    # same_length: every query sees exactly mem_len keys, so even a memory shorter than the text gives
    # identical results token by token and segment by segment.
    model = tiny_model(seed=2, mem_len=9, same_length=True)
    tokens = torch.randint(0, 64, (1, 33), generator=torch.Generator().manual_seed(3))
    by_token, _ = _log_probs_in_steps(model, tokens, [1] * 33)
    by_segment, _ = _log_probs_in_steps(model, tokens, [9, 9, 9, 6])
    torch.testing.assert_close(by_segment, by_token, rtol=0, atol=1e-5)


def test_batched_memories_of_different_lengths_equal_running_each_alone(model):
    generator = torch.Generator().manual_seed(5)
    prefixes = [torch.randint(0, 64, (1, n), generator=generator) for n in (0, 3, 11, 11)]
    step = torch.randint(0, 64, (4, 4), generator=generator)
    memories, alone = [], []
    with torch.inference_mode():
        for i, prefix in enumerate(prefixes):
            memory = model.empty_memory()
            if prefix.numel():
                _, memory = model(prefix, memory)
            memories.append(memory)
            hidden, _ = model(step[i : i + 1], memory)
            alone.append(model.log_probs(hidden))
        # Rows 2 and 3 share a length: one group of two rows; the others are groups of one.
        pair = txl.Memory.from_tensors(
            model.memory_layout(),
            {
                k: torch.cat([a, b])
                for (k, a), b in zip(
                    memories[2].to_tensors().items(), memories[3].to_tensors().values(), strict=True
                )
            },
            mem_len=memories[2].mem_len,
        )
        hidden, new_memories = model(step, [memories[0], memories[1], pair])
        batched = model.log_probs(hidden)
    torch.testing.assert_close(batched, torch.cat(alone), rtol=0, atol=1e-5)
    assert [m.length for m in new_memories] == [4, 7, 15]


def test_a_step_leaves_the_memory_it_was_given_valid(model, tokens):
    with torch.inference_mode():
        _, base = model(tokens[:, :10], model.empty_memory(2))
        snapshot = {k: v.clone() for k, v in base.to_tensors().items()}
        hidden_a, after_a = model(tokens[:, 10:15], base)  # appends in place after base's columns
        hidden_b, after_b = model(
            tokens[:, 20:25], base
        )  # a second branch from the same memory: copy-on-write
        hidden_a2, _ = model(tokens[:, 10:15], base)
    for name, value in base.to_tensors().items():
        assert torch.equal(value, snapshot[name]), name
    # The first step appends in place after base's positions (same blocks); the second finds base's last
    # block written past its end, so it continues in a copy of that block (base holds one block here).
    assert set(after_a.block_ids()) == set(base.block_ids())
    assert not after_b.shares_blocks_with(base)
    torch.testing.assert_close(hidden_a2, hidden_a, rtol=0, atol=0)
    assert not torch.allclose(hidden_a, hidden_b)
    assert after_a.length == after_b.length == 15


def test_memory_keeps_the_last_mem_len_positions_and_compacts(model, tokens):
    short = model.empty_memory(2, mem_len=6)
    with torch.inference_mode():
        for t in range(SEQ):
            _, short = model(tokens[:, t : t + 1], short)
            assert short.length == min(t + 1, 6)
    layout = model.memory_layout()
    assert short.nbytes == 2 * 6 * layout.n_layer * 2 * layout.n_head * layout.d_head * 4
    assert short.allocated_nbytes >= short.nbytes


@pytest.mark.parametrize("seg_len", [1, 4, 16])
def test_blocks_stay_within_the_bounds_capacity_planning_uses(model, seg_len):
    """`resting_blocks` and `peak_blocks` are what budgets rely on: fed segments, then decoding, a memory at
    rest never spans more blocks than the first says, a step (the old memory still alive) never more than the
    second, and decoding reaches both (they are not loose bounds)."""
    mem_len, block_size = 23, 4
    pool = txl.BlockPool(model.memory_layout(), block_size=block_size)  # its usage is this memory's alone
    rest_bound = 2 * resting_blocks(mem_len, block_size)  # a batch of 2
    memory = model.empty_memory(2, mem_len=mem_len, pool=pool)
    steps = torch.randint(0, 64, (2, 12 * 16), generator=torch.Generator().manual_seed(3))
    rest, during = [], []
    with torch.inference_mode():
        phases = [(seg_len, range(0, steps.size(1), seg_len)), (1, range(40))]
        for size, starts in phases:
            for start in starts:
                _, after = model(steps[:, start : start + size], memory)
                during.append((pool.used_blocks, 2 * peak_blocks(mem_len, size, block_size)))
                memory.release()
                memory = after
                rest.append(pool.used_blocks)
    assert all(used <= bound for used, bound in during), during
    assert max(rest) <= rest_bound and rest[-40:].count(rest_bound) > 0
    assert any(used == bound for used, bound in during[-40:])
    memory.release()
    assert pool.used_blocks == 0  # every block went back


def test_bfloat16_decoding_follows_float32(model, tokens):
    """Half precision takes its own CPU path (strided slices copied before bmm): token by token over a memory
    longer than one step, single sessions and a batch, it stays with float32 to bfloat16's precision."""
    half = tiny_model(seed=1, mem_len=SEQ, same_length=False).to(torch.bfloat16)
    reference, _ = _log_probs_in_steps(model, tokens, [SEQ])
    for batch in (tokens[:1], tokens):
        got, _ = _log_probs_in_steps(half, batch, [8] + [1] * (SEQ - 8))
        error = (got.float() - reference[: batch.size(0)]).abs()
        assert error.mean() < 0.02 and error.max() < 0.25, (error.mean(), error.max())


def test_mem_len_zero_remembers_nothing(model, tokens):
    with torch.inference_mode():
        _, memory = model(tokens[:, :5], model.empty_memory(2, mem_len=0))
        assert memory.length == 0 and memory.nbytes == 0
        hidden_b, _ = model(tokens[:, 5:10], memory)
        hidden_c, _ = model(tokens[:, 5:10], model.empty_memory(2, mem_len=0))
    torch.testing.assert_close(hidden_b, hidden_c, rtol=0, atol=0)


def test_memory_tensors_round_trip_and_shrink(model, tokens):
    with torch.inference_mode():
        _, memory = model(tokens[:, :20], model.empty_memory(2))
        restored = txl.Memory.from_tensors(model.memory_layout(), memory.to_tensors(), mem_len=memory.mem_len)
        expected, _ = model(tokens[:, 20:24], memory)
        got, _ = model(tokens[:, 20:24], restored)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        shrunk = memory.with_mem_len(5)
        assert shrunk.length == 5
        torch.testing.assert_close(shrunk.keys(0), memory.keys(0)[:, :, -5:])


def test_from_tensors_rejects_mismatched_shapes(model, tokens):
    with torch.inference_mode():
        _, memory = model(tokens[:, :4], model.empty_memory(2))
    tensors = memory.to_tensors()
    tensors["keys.1"] = tensors["keys.1"][:, :1]
    with pytest.raises(ValueError, match=r"keys\.1"):
        txl.Memory.from_tensors(model.memory_layout(), tensors, mem_len=8)
    tensors = memory.to_tensors()
    del tensors["values.0"]
    with pytest.raises(ValueError, match="missing"):
        txl.Memory.from_tensors(model.memory_layout(), tensors, mem_len=8)


def test_training_forward_is_the_inference_function(tokens):
    # The training path (hidden-state memory re-projected with gradients, pad-and-reshape shift) computes
    # the same function as the cached inference path.
    model = tiny_model(seed=4, mem_len=12, same_length=False)
    model.train()  # dropout is 0 in the tiny config
    hidden_memory = model.empty_hidden_memory(2)
    train_out = []
    for start in range(0, SEQ, 8):
        hidden, hidden_memory = model(tokens[:, start : start + 8], hidden_memory)
        train_out.append(model.log_probs(hidden).detach())
    model.eval()
    infer, _ = _log_probs_in_steps(model, tokens, [8] * 5, mem_len=12)
    torch.testing.assert_close(torch.cat(train_out, 1), infer, rtol=0, atol=1e-5)
