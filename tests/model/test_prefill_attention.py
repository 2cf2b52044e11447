"""A prompt segment's attention in one native call per layer (txl.kernels.cpu.prefill_attention) equals the torch path:
alone, on random rows against a float64 reference, and inside the model; and it is taken exactly where its decode
path names it and it applies."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import txl
from torch import Tensor
from txl.kernels import REFERENCE, DecodePath, prefill_kernel
from txl.kernels.cpu import prefill_attention
from txl.kernels.cpu.build import openmp_runtimes
from txl.kernels.cpu.prefill_attention import cpu_prefill_attention

from tests.helpers.tiny_models import tiny_model

needs_kernel = pytest.mark.skipif(
    cpu_prefill_attention() is None, reason="no C compiler here: the prefill attention could not be built"
)
C_PREFILL = DecodePath(prefill="c")  # the C kernel for prompt segments, all else torch's


@dataclass(frozen=True)
class Rows:
    """A `txl.kernels.cpu.prefill_attention.PrefillRows`."""

    token_index: Tensor  # [B*T]
    table: Tensor  # [B, S]
    starts: Tensor  # [B]
    key_lengths: Tensor  # [B]
    windows: Tensor  # [B, T]


def _random_case(rng: random.Random, queries: int):
    """A query group over shuffled blocks: rows with memories of 0, 1 or more positions, each starting anywhere in
    its first block, windows unbounded or shorter than the memory, tokens in any order among other rows', and
    positional keys that are a slice of a longer table (heads apart)."""
    heads, d_head, bs = rng.randint(1, 3), rng.choice([5, 8, 12, 32, 64]), rng.choice([1, 3, 4, 16])
    batch = rng.randint(1, 4)
    memories = [rng.choice([0, 1, rng.randint(2, 90)]) for _ in range(batch)]
    starts = [rng.randint(0, bs - 1) for _ in range(batch)]
    key_lengths = [m + queries for m in memories]
    blocks = [math.ceil((s + k) / bs) for s, k in zip(starts, key_lengths, strict=True)]
    n_blocks = sum(blocks) + 3
    free = list(range(1, n_blocks))
    rng.shuffle(free)
    width = max(blocks) + rng.randint(0, 2)
    table = torch.zeros(batch, width, dtype=torch.long)  # padding: the null block 0
    for b, count in enumerate(blocks):
        table[b, :count] = torch.tensor([free.pop() for _ in range(count)])
    n_pos = max(key_lengths) + rng.choice([0, 3])
    windows = [
        [n_pos + 1 if rng.random() < 0.5 else rng.randint(1, k) for _ in range(queries)] for k in key_lengths
    ]
    n_tokens = batch * queries + rng.randint(0, 5)  # other rows' tokens among them
    token_index = torch.randperm(n_tokens, generator=torch.Generator().manual_seed(rng.randint(0, 999)))
    rows = Rows(
        token_index[: batch * queries].clone(),
        table,
        torch.tensor(starts),
        torch.tensor(key_lengths),
        torch.tensor(windows),
    )
    g = torch.Generator().manual_seed(rng.randint(0, 2**31))
    q_content = torch.randn(n_tokens, heads, d_head, generator=g)
    q_position = torch.randn(n_tokens, heads, d_head, generator=g)
    keys = torch.randn(heads, n_blocks, bs, d_head, generator=g)
    values = torch.randn(heads, n_blocks, bs, d_head, generator=g)
    table_positions = torch.randn(heads, n_pos + 7, d_head, generator=g)
    positions = table_positions[:, 7:]  # distances n_pos-1..0
    return q_content, q_position, keys, values, positions, rows


def _reference(q_content, q_position, keys, values, positions, rows, queries):
    """The contract in float64: [B*T, H, Dh]."""
    heads, _, bs, d_head = keys.shape
    batch = rows.table.size(0)
    n_pos = positions.size(1)
    out = torch.zeros(batch * queries, heads, d_head, dtype=torch.float64)
    for b in range(batch):
        start, p0 = int(rows.starts[b]), int(rows.starts[b] + rows.key_lengths[b]) - queries
        slots = torch.arange(rows.table.size(1) * bs)
        row_keys = keys[:, rows.table[b, slots // bs], slots % bs].double()  # [H, L, Dh]
        row_values = values[:, rows.table[b, slots // bs], slots % bs].double()
        for i in range(queries):
            p, token = p0 + i, int(rows.token_index[b * queries + i])
            first = max(start, p - int(rows.windows[b, i]) + 1)
            seen = torch.arange(first, p + 1)
            content = torch.einsum("hd,hjd->hj", q_content[token].double(), row_keys[:, seen])
            distance_keys = positions[:, n_pos - 1 - (p - seen)].double()  # [H, J, Dh]
            positional = torch.einsum("hd,hjd->hj", q_position[token].double(), distance_keys)
            prob = torch.softmax(content + positional, dim=-1)
            out[b * queries + i] = torch.einsum("hj,hjd->hd", prob, row_values[:, seen])
    return out


@needs_kernel
@pytest.mark.parametrize("seed", range(8))
def test_the_kernel_meets_its_contract_on_random_rows(seed):
    rng = random.Random(seed)
    kernel = cpu_prefill_attention()
    for queries in (1, 2, 7, 13, 30):
        case = _random_case(rng, queries)
        got = kernel(*case, queries)
        expected = _reference(*case, queries)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=2e-5)


@needs_kernel
def test_the_kernel_splits_its_rows_and_heads_over_torchs_threads_with_the_same_bits():
    """Each (head, row) is one thread's whole work, so any split gives the same bits; items that do not divide
    evenly, and fewer items than threads, included. Built with OpenMP, the kernel binds to torch's runtime: the
    process maps one OpenMP library, so the kernel's team is torch's own."""
    kernel = cpu_prefill_attention()
    if "OpenMP" in torch.__config__.parallel_info():
        assert kernel.threaded and len(openmp_runtimes()) == 1
    rng = random.Random(5)
    cases = [_random_case(rng, queries) for queries in (1, 7, 13, 30)]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [
            kernel(*case, case_queries) for case, case_queries in zip(cases, (1, 7, 13, 30), strict=True)
        ]
        for threads in (2, 3, 5):
            torch.set_num_threads(threads)
            for case, queries, expected in zip(cases, (1, 7, 13, 30), alone, strict=True):
                assert torch.equal(kernel(*case, queries), expected)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(alone[-1].double(), _reference(*cases[-1], 30), rtol=1e-5, atol=2e-5)


def _feed(model, lengths, segments, *, block_size, threads=None):
    """Log-probs of every new position, from memories of `lengths`, fed `segments` (tokens per row per step)
    with the kernel and along the torch path; and the pools' keys afterwards."""
    results = []
    for path in (C_PREFILL, REFERENCE):
        pool = txl.BlockPool(model.memory_layout(), block_size=block_size)
        generator = torch.Generator().manual_seed(sum(lengths))
        out = []
        with torch.inference_mode():
            memories = []
            for n in lengths:
                memory = model.empty_memory(1, pool=pool)
                if n:
                    _, memory = model(torch.randint(0, 64, (1, n), generator=generator), memory, path=path)
                memories.append(memory)
            for width in segments:
                tokens = torch.randint(0, 64, (len(lengths), width), generator=generator)
                hidden, memories = model(tokens, memories, path=path)
                out.append(model.log_probs(hidden, path).flatten(1))
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


def _takes_kernel(monkeypatch, model, tokens, memory, context, path=C_PREFILL) -> bool:
    calls = []
    original = prefill_attention.PrefillAttentionKernel.__call__

    def counted(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(prefill_attention.PrefillAttentionKernel, "__call__", counted)
    with context:
        model(tokens, memory, path=path)
    monkeypatch.undo()
    return bool(calls)


@needs_kernel
def test_the_kernel_is_taken_exactly_where_it_applies(monkeypatch):
    model = tiny_model(seed=43)
    segment, token = torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long)
    memory = model.empty_memory(2, pool=txl.BlockPool(model.memory_layout(), block_size=4))
    assert _takes_kernel(monkeypatch, model, segment, memory, torch.inference_mode())
    assert _takes_kernel(monkeypatch, model, segment, memory, torch.no_grad())
    assert _takes_kernel(monkeypatch, model, segment, memory, torch.no_grad(), DecodePath.c())
    # Not: decoding (its own kernels), a path that does not name it (the reference; the C decoding kernels
    # alone), bfloat16.
    assert not _takes_kernel(monkeypatch, model, token, memory, torch.inference_mode())
    assert not _takes_kernel(monkeypatch, model, segment, memory, torch.no_grad(), REFERENCE)
    only_decoding = DecodePath(attention="c", layers="c", linear=("c",))
    assert not _takes_kernel(monkeypatch, model, segment, memory, torch.no_grad(), only_decoding)
    half = tiny_model(seed=43).to(torch.bfloat16)
    assert not _takes_kernel(monkeypatch, half, segment, half.empty_memory(2), torch.inference_mode())
    # Nor while autograd records (the paged forward never does; the pass writes in place, unseen by autograd).
    keys = memory.pool.keys[0]
    query = torch.zeros(2, 5, 8, requires_grad=True)
    assert prefill_kernel(C_PREFILL, keys, query.detach()) is not None
    assert prefill_kernel(C_PREFILL, keys, query) is None
    assert prefill_kernel(REFERENCE, keys, query.detach()) is None
    with torch.no_grad():
        assert prefill_kernel(C_PREFILL, keys, query) is not None


def test_the_kernels_built_for_avx2_alone_meet_the_same_contracts(tmp_path):
    """TXL_CPU_KERNEL_ISA=avx2 builds the C kernels without AVX-512 (the tiles of 8-float vectors an AVX2-only
    CPU runs): on an AVX-512 machine this is the only way that code is tested. A process of its own, with its own
    kernel cache."""
    if cpu_prefill_attention() is None:
        pytest.skip("no C compiler here")
    env = {**os.environ, "TXL_CPU_KERNEL_ISA": "avx2", "TXL_KERNEL_CACHE": str(tmp_path)}
    root = Path(__file__).resolve().parents[2]
    tests = [
        "tests/model/test_prefill_attention.py::test_the_kernel_meets_its_contract_on_random_rows",
        "tests/model/test_prefill_attention.py::test_prompt_segments_through_the_kernel_equal_the_torch_path",
        "tests/model/test_kernels.py::test_cpu_decode_kernel_meets_the_contract_on_random_rows",
        "tests/model/test_fused_decode.py::test_fused_decoding_equals_the_layer_by_layer_path",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *tests],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-500:]
    built = {path.name.split("-")[0] for path in tmp_path.glob("*.so")}
    assert {"prefill_attention", "paged_decode", "decode_layer"} <= built, built
