"""A decoding step through one native call per layer (txl.paged.fused_decode) equals the layer-by-layer path, writes the
pool alike, and is taken exactly where its decode path names it and it applies."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import txl
from torch import nn
from txl.kernels import REFERENCE, DecodePath
from txl.kernels.cpu.decode_layer import cpu_decode_layer
from txl.paged import fused_decode

from tests.helpers.tiny_models import tiny_model

needs_kernel = pytest.mark.skipif(
    cpu_decode_layer() is None, reason="no C compiler here: the native decode layer could not be built"
)
FUSED = DecodePath.c()  # the C kernels: the fused layer where it applies
LAYER_BY_LAYER = dataclasses.replace(FUSED, layers="torch")  # the same kernels, layer by layer


def _history(model, pool, lengths, generator):
    """One memory per length, each fed that many random tokens in one step; a fork of the first for a 4th row."""
    memories = []
    with torch.inference_mode():
        for n in lengths:
            memory = model.empty_memory(1, pool=pool, keep_hidden=pool.keep_hidden)
            if n:
                tokens = torch.randint(0, model.config.vocab_size, (1, n), generator=generator)
                _, memory = model(tokens, memory)
            memories.append(memory)
    return memories


def _decode(model, lengths, *, fused, block_size, keep_hidden, steps=4, seed=0):
    """Log-probabilities [rows, steps, V] of greedy decoding from memories of `lengths` (the first continued by
    two rows: they share its blocks), and every memory's tensors afterwards."""
    pool = txl.BlockPool(model.memory_layout(), block_size=block_size, keep_hidden=keep_hidden)
    memories = _history(model, pool, lengths, torch.Generator().manual_seed(seed))
    memories.append(memories[0])  # a fork: both rows continue the same memory
    tokens = torch.arange(len(memories))[:, None] % model.config.vocab_size
    out = []
    path = FUSED if fused else LAYER_BY_LAYER
    with torch.inference_mode():
        for _ in range(steps):
            hidden, memories = model(tokens, memories, path=path)
            log_probs = model.log_probs(hidden[:, -1], path)
            out.append(log_probs)
            tokens = log_probs.argmax(-1, keepdim=True)
    return torch.stack(out, 1), [m.to_tensors() for m in memories]


@needs_kernel
@pytest.mark.parametrize(
    ("overrides", "block_size", "keep_hidden"),
    [
        (dict(), 4, False),
        (dict(same_length=True, clamp_len=5), 1, False),
        (dict(pre_lnorm=True), 16, True),
        (dict(d_head=32, n_head=2, d_model=32, d_embed=32, mem_len=9), 3, False),  # Dh 32: its own code path
        (dict(d_head=64, n_head=1, d_model=24, d_embed=24, d_inner=40, untie_r=False), 5, False),  # Dh 64
        (dict(d_head=12, n_head=3, d_model=20, d_embed=20, div_val=1, cutoffs=[]), 2, True),
    ],
)
def test_fused_decoding_equals_the_layer_by_layer_path(overrides, block_size, keep_hidden):
    model = tiny_model(seed=31, **overrides)
    mem_len = model.config.mem_len
    lengths = [mem_len + 7, 0, 1]  # a full memory that drops positions every step, an empty one, one position
    got, got_memories = _decode(model, lengths, fused=True, block_size=block_size, keep_hidden=keep_hidden)
    expected, expected_memories = _decode(
        model, lengths, fused=False, block_size=block_size, keep_hidden=keep_hidden
    )
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-5)  # log-probs up to ~30 in size
    for got_memory, expected_memory in zip(got_memories, expected_memories, strict=True):
        assert got_memory.keys() == expected_memory.keys()
        for name, tensor in got_memory.items():
            torch.testing.assert_close(tensor, expected_memory[name], rtol=0, atol=1e-5)


@needs_kernel
def test_fused_decoding_after_a_weight_is_replaced_reads_the_new_one():
    model = tiny_model(seed=32)
    lengths = [5, 9]
    before, _ = _decode(model, lengths, fused=True, block_size=4, keep_hidden=False)
    attention = model.transformer.layers[1].dec_attn
    with torch.no_grad():
        attention.qkv_net.weight = nn.Parameter(attention.qkv_net.weight * 1.5)
        model.transformer.layers[0].pos_ff.CoreNet[0].bias.mul_(-1)  # in place: same tensor, new values
    model.double().float()  # the same parameters, their data moved (and the old data freed)
    torch.zeros(10_000_000).fill_(7)  # likely to take the freed memory over
    got, _ = _decode(model, lengths, fused=True, block_size=4, keep_hidden=False)
    expected, _ = _decode(model, lengths, fused=False, block_size=4, keep_hidden=False)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert (got - before).abs().max() > 1e-2


def _takes_fused(monkeypatch, model, tokens, memory, path=FUSED) -> bool:
    calls = []
    original = fused_decode.forward

    def counted(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(fused_decode, "forward", counted)
    with torch.inference_mode():
        model(tokens, memory, path=path)
    return bool(calls)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_the_fused_path_is_taken_exactly_where_it_applies(monkeypatch, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert fused_decode.max_rows() == 16  # on torch's team, or one thread
        _check_where_it_applies(monkeypatch)
        # A call that could not share torch's team (another OpenMP runtime loaded) keeps to 4 rows beside it.
        monkeypatch.setattr(cpu_decode_layer(), "threaded", False)
        assert fused_decode.max_rows() == (16 if threads == 1 else 4)
        _check_where_it_applies(monkeypatch)
    finally:
        torch.set_num_threads(before)


def _check_where_it_applies(monkeypatch):
    model = tiny_model(seed=33)
    pool = txl.BlockPool(model.memory_layout(), block_size=4)
    rows = fused_decode.max_rows()
    one = torch.zeros(rows, 1, dtype=torch.long)
    memory = model.empty_memory(rows, pool=pool)
    assert _takes_fused(monkeypatch, model, one, memory)
    assert _takes_fused(monkeypatch, model, one, memory, DecodePath.c(linear=("c",)))
    # Not: more rows, prompt segments, a path that does not name it (another linear kernel asked for: its
    # products are the C loop's; the reference; the C kernels layer by layer).
    wide = model.empty_memory(rows + 1, pool=pool)
    assert not _takes_fused(monkeypatch, model, torch.zeros(rows + 1, 1, dtype=torch.long), wide)
    assert not _takes_fused(monkeypatch, model, torch.zeros(rows, 2, dtype=torch.long), memory)
    assert not _takes_fused(monkeypatch, model, one, memory, DecodePath.c(linear=("torch",)))
    assert not _takes_fused(monkeypatch, model, one, memory, REFERENCE)
    assert not _takes_fused(monkeypatch, model, one, memory, LAYER_BY_LAYER)
    # Not when the rows' products outgrow the weight reads (MAX_WORK multiply-adds a layer).
    size = fused_decode._fused_layer(model.transformer.layers[0]).size
    monkeypatch.setattr(fused_decode, "MAX_WORK", size * (rows - 1))
    assert not _takes_fused(monkeypatch, model, one, memory)
    fewer = model.empty_memory(rows - 1, pool=pool)
    assert _takes_fused(monkeypatch, model, torch.zeros(rows - 1, 1, dtype=torch.long), fewer)
    monkeypatch.undo()
    # Not in bfloat16, nor in training mode.
    half = tiny_model(seed=33).to(torch.bfloat16)
    assert not _takes_fused(monkeypatch, half, one, half.empty_memory(rows))
    assert not _takes_fused(monkeypatch, model.train(), one, memory)


@needs_kernel
@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_fused_decoding_on_torchs_threads_gives_the_bits_of_one_thread(monkeypatch, pre_lnorm):
    """Each output feature and each (head, row) of attention is one thread's whole work: a step's native layers
    give the bits of one thread on 2, 3 or 5 threads (more than rows or heads), and write the pool alike. The
    same call is repeated on the same inputs (what comes before it, torch's embedding products, may round
    differently with the thread count)."""
    kernel = cpu_decode_layer()
    if "OpenMP" in torch.__config__.parallel_info():
        assert kernel.threaded
    model = tiny_model(seed=35, pre_lnorm=pre_lnorm, d_head=16, n_head=3, d_model=40, d_embed=40)
    pool = txl.BlockPool(model.memory_layout(), block_size=4, keep_hidden=True)
    memories = _history(model, pool, [0, 1, 4, 7, 12, 30], torch.Generator().manual_seed(1))
    calls = []
    original = fused_decode.forward
    monkeypatch.setattr(fused_decode, "forward", lambda *args: calls.append(args) or original(*args))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.inference_mode():
            model(torch.tensor([[3], [1], [4], [1], [5], [9]]), memories, path=FUSED)
        assert len(calls) == 1  # the step took the native call
        fused, step, hidden, tables = calls[0][:4]
        expected = original(fused, step, hidden.clone(), tables)
        pool_after = [pool.keys.clone(), pool.values.clone(), pool.hidden.clone()]
        for threads in (2, 3, 5):
            torch.set_num_threads(threads)
            assert torch.equal(original(fused, step, hidden.clone(), tables), expected)
            # As bits: blocks never written hold whatever the allocator left, NaNs included.
            now = (pool.keys, pool.values, pool.hidden)
            assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(now, pool_after))
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_fused_decoding_of_many_rows_on_one_thread_equals_the_layer_by_layer_path():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = tiny_model(seed=34, d_head=16, n_head=2, d_model=24, d_embed=24)
        lengths = [0, 1, 2, 3, 5, 8, 13, 15, 16, 17, 30]  # with the fork: 12 rows
        assert len(lengths) + 1 <= fused_decode.max_rows()
        got, _ = _decode(model, lengths, fused=True, block_size=4, keep_hidden=False)
        expected, _ = _decode(model, lengths, fused=False, block_size=4, keep_hidden=False)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-5)


@needs_kernel
def test_a_steps_layers_run_in_one_native_call_with_the_bits_of_one_call_a_layer(monkeypatch):
    """One call for the step's layers gives up the GIL once (a server's event loop then never holds it up between
    layers), and computes what one call a layer computes, bit for bit."""
    from txl.kernels.cpu.decode_layer import DecodeLayerKernel

    model = tiny_model(seed=36, d_head=16, n_head=2, d_model=24, d_embed=24, n_layer=3)
    # Once first: the linear kernels are chosen by timing on a shape's first use, and may differ from then on.
    _decode(model, [0, 3, 9], fused=True, block_size=4, keep_hidden=True, steps=3)
    calls: list[str] = []
    layers, one = DecodeLayerKernel.layers, DecodeLayerKernel.__call__
    monkeypatch.setattr(
        DecodeLayerKernel, "layers", lambda self, *a: calls.append("layers") or layers(self, *a)
    )
    monkeypatch.setattr(DecodeLayerKernel, "__call__", lambda self, *a: calls.append("one") or one(self, *a))
    together, kept_together = _decode(model, [0, 3, 9], fused=True, block_size=4, keep_hidden=True, steps=3)
    assert calls == ["layers"] * 3  # one call a step

    def one_a_layer(self, layer_args, states, rows, x, scratch, threads):
        for layer, state in zip(layer_args, states, strict=True):
            one(self, layer, state, rows, x, scratch, threads)

    monkeypatch.setattr(DecodeLayerKernel, "layers", one_a_layer)
    apart, kept_apart = _decode(model, [0, 3, 9], fused=True, block_size=4, keep_hidden=True, steps=3)
    assert torch.equal(together, apart)
    for a, b in zip(kept_together, kept_apart, strict=True):
        assert all(torch.equal(a[k].view(torch.int32), b[k].view(torch.int32)) for k in a)
