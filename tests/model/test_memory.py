"""Caching is exact: the memory gives the same results however the text is cut into steps."""

from __future__ import annotations

import pytest
import torch
import txl

from .helpers import tiny_model

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
    assert after_a.shares_storage_with(base) and not after_b.shares_storage_with(base)
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
def test_buffers_never_exceed_peak_positions(model, seg_len):
    """`peak_positions` is what capacity planning relies on: stepping by segments, then decoding, the buffers
    never hold more positions than it says, and they do reach it (it is not a loose bound)."""
    mem_len = 24
    layout = model.memory_layout()
    per_position = 2 * layout.bytes_per_position()  # batch of 2
    bound = txl.peak_positions(mem_len, seg_len) * per_position
    memory, largest = model.empty_memory(2, mem_len=mem_len), 0
    steps = torch.randint(0, 64, (2, 12 * 16), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        for start in range(0, steps.size(1), seg_len):
            _, memory = model(steps[:, start : start + seg_len], memory)
            largest = max(largest, memory.allocated_nbytes)
            assert memory.allocated_nbytes <= bound, (start, memory.allocated_nbytes, bound)
        for t in range(40):  # decoding after the segments: its compactions stay within the bound too
            _, memory = model(steps[:, t : t + 1], memory)
            assert memory.allocated_nbytes <= bound
    assert largest == bound


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
