"""The native pass over a prompt segment's attention scores (txl.kernels.prefill) equals the torch path: alone, on
random rows against a float64 reference, and inside the model; and it is taken exactly where it applies."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch
import txl
from txl.kernels import prefill, prefill_kernel, reference_path
from txl.kernels.prefill import cpu_prefill_softmax
from txl.paged_step import QueryGroup

from .helpers import tiny_model

needs_kernel = pytest.mark.skipif(
    cpu_prefill_softmax() is None, reason="no C compiler here: the prefill softmax could not be built"
)


def _random_rows(rng: random.Random, heads: int, queries: int):
    """Rows of a query group: each with its first position's offset, its memory, and a window per query
    (unbounded, or shorter than the memory as same_length makes them)."""
    batch = rng.randint(1, 4)
    memories = [rng.choice([0, 1, rng.randint(2, 40)]) for _ in range(batch)]
    starts = [rng.randint(0, 5) for _ in range(batch)]
    key_lengths = [m + queries for m in memories]
    slots = max(s + k for s, k in zip(starts, key_lengths, strict=True)) + rng.randint(0, 3)
    n_pos = max(key_lengths) + rng.choice([0, 4])
    windows = [
        [n_pos + 1 if rng.random() < 0.5 else rng.randint(1, k) for _ in range(queries)] for k in key_lengths
    ]
    return batch, torch.tensor(starts), torch.tensor(key_lengths), torch.tensor(windows), slots, n_pos


def _reference(score, by_distance, starts, key_lengths, windows):
    """The contract in float64 torch: each query at p = start + klen - T + i sees slots [max(start, p - w + 1), p],
    scored AC + the positional score at column P-1-(p-j); softmax over them, 0 elsewhere."""
    heads, batch, queries, slots = score.shape
    n_pos = by_distance.size(2)
    position = (starts + key_lengths - queries)[:, None, None] + torch.arange(queries)[None, :, None]
    key = torch.arange(slots)[None, None, :]
    distance = position - key  # [B, T, L]
    visible = (key >= starts[:, None, None]) & (distance >= 0) & (distance < windows[:, :, None])
    column = (n_pos - 1 - distance).clamp(0, n_pos - 1).expand(heads, -1, -1, -1)
    positional = by_distance.double().view(heads, batch, queries, n_pos).gather(3, column)
    total = (score.double() + positional).masked_fill(~visible, -torch.inf)
    return torch.softmax(total, dim=-1)


@needs_kernel
@pytest.mark.parametrize("seed", range(6))
def test_the_kernel_meets_its_contract_on_random_rows(seed):
    rng = random.Random(seed)
    kernel = cpu_prefill_softmax()
    for queries in (2, 3, 17):
        heads = rng.randint(1, 3)
        batch, starts, key_lengths, windows, slots, n_pos = _random_rows(rng, heads, queries)
        score = 4 * torch.randn(heads, batch, queries, slots)  # wide scores: weights down to exp(-50)
        by_distance = 4 * torch.randn(heads, batch * queries, n_pos)
        expected = _reference(score, by_distance, starts, key_lengths, windows)
        rows = QueryGroup(queries, None, None, starts, key_lengths, windows, n_pos, 1, heads, 1)  # type: ignore[arg-type]
        kernel(score, by_distance, rows, queries)
        torch.testing.assert_close(score.double(), expected, rtol=2e-6, atol=1e-7)


def _feed(model, lengths, segments, *, block_size, threads=None):
    """Log-probs of every new position, from memories of `lengths`, fed `segments` (tokens per row per step)
    with the kernel and along the torch path; and the pools' keys afterwards."""
    results = []
    for path in (contextlib.nullcontext, reference_path):
        pool = txl.BlockPool(model.memory_layout(), block_size=block_size)
        generator = torch.Generator().manual_seed(sum(lengths))
        out = []
        with torch.inference_mode(), path():
            memories = []
            for n in lengths:
                memory = model.empty_memory(1, pool=pool)
                if n:
                    _, memory = model(torch.randint(0, 64, (1, n), generator=generator), memory)
                memories.append(memory)
            for width in segments:
                tokens = torch.randint(0, 64, (len(lengths), width), generator=generator)
                hidden, memories = model(tokens, memories)
                out.append(model.log_probs(hidden).flatten(1))
        results.append((torch.cat(out, 1), [m.to_tensors() for m in memories]))
    return results


@needs_kernel
@pytest.mark.parametrize(
    ("overrides", "block_size"),
    [
        (dict(), 4),
        (dict(same_length=True, clamp_len=5, mem_len=9), 1),
        (dict(pre_lnorm=True, mem_len=20), 16),
        (dict(d_head=32, n_head=2, d_model=32, d_embed=32, mem_len=9), 3),
    ],
)
def test_prompt_segments_through_the_kernel_equal_the_torch_path(overrides, block_size):
    model = tiny_model(seed=41, **overrides)
    mem_len = model.config.mem_len
    # An empty memory, one position, a block boundary, and a full memory that drops positions with each segment.
    lengths = [0, 1, block_size, mem_len + 7]
    (got, got_memories), (expected, expected_memories) = _feed(
        model, lengths, [6, 2, 11], block_size=block_size
    )
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-5)
    for got_memory, expected_memory in zip(got_memories, expected_memories, strict=True):
        for name, tensor in got_memory.items():
            torch.testing.assert_close(tensor, expected_memory[name], rtol=0, atol=1e-5)


def _takes_kernel(monkeypatch, model, tokens, memory, context) -> bool:
    calls = []
    original = prefill.PrefillSoftmaxKernel.__call__

    def counted(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(prefill.PrefillSoftmaxKernel, "__call__", counted)
    with context:
        model(tokens, memory)
    monkeypatch.undo()
    return bool(calls)


@needs_kernel
def test_the_kernel_is_taken_exactly_where_it_applies(monkeypatch):
    model = tiny_model(seed=43)
    segment, token = torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long)
    memory = model.empty_memory(2, pool=txl.BlockPool(model.memory_layout(), block_size=4))
    assert _takes_kernel(monkeypatch, model, segment, memory, torch.inference_mode())
    assert _takes_kernel(monkeypatch, model, segment, memory, torch.no_grad())
    # Not: decoding (its own kernels), the torch path asked for, bfloat16.
    assert not _takes_kernel(monkeypatch, model, token, memory, torch.inference_mode())
    assert not _takes_kernel(monkeypatch, model, segment, memory, reference_path())
    half = tiny_model(seed=43).to(torch.bfloat16)
    assert not _takes_kernel(monkeypatch, half, segment, half.empty_memory(2), torch.inference_mode())
    # Nor while autograd records (the paged forward never does; the pass writes in place, unseen by autograd).
    keys = memory.pool.keys[0]
    query = torch.zeros(2, 5, 8, requires_grad=True)
    assert prefill_kernel(keys, query.detach()) is not None
    assert prefill_kernel(keys, query) is None
    with torch.no_grad():
        assert prefill_kernel(keys, query) is not None
