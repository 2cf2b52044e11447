"""The decode path (txl.kernels.path): one value naming what runs each part of a step, which every call that computes
takes as an argument; a kernel runs exactly where the path names it, and the default is the reference (torch's
operations everywhere)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import txl
from txl.kernels import REFERENCE, DecodePath, fastest
from txl.kernels.cpu import paged_decode
from txl.kernels.cpu.paged_decode import cpu_paged_decode
from txl.kernels.triton import embedding as triton_embedding
from txl.kernels.triton import sampling as triton_sampling
from txl.kernels.triton import softmax as triton_softmax
from txl.sampling import RowParams, SamplingParams, sample_rows

from tests.helpers.tiny_models import tiny_model


def test_a_path_names_every_part_and_refuses_what_no_kernel_is():
    assert DecodePath() == REFERENCE and REFERENCE.describe() == (
        "attention torch, prefill torch, layers torch, linear torch, embedding torch, softmax torch, "
        "sampler torch, graphs off"
    )
    c = DecodePath.c(graphs="static")
    assert c.describe() == (
        "attention c, prefill c, layers c, linear fastest of torch/onednn/c, embedding torch, softmax torch, "
        "sampler torch, graphs static"
    )
    assert DecodePath.c(linear=("torch",)).layers == "torch"  # its products are the C loop's: not without it
    triton = DecodePath.triton()
    assert {triton.attention, triton.layers, triton.embedding, triton.softmax, triton.sampler} == {"triton"}
    for wrong in (dict(attention="cpu"), dict(prefill="triton"), dict(sampler="c"), dict(graphs="on")):
        with pytest.raises(ValueError, match=next(iter(wrong))):
            DecodePath(**wrong)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.attention = "torch"  # type: ignore[misc]


def test_a_paths_linear_kernels_are_one_set_in_one_order_and_its_torch_variant_keeps_them():
    assert DecodePath(linear=("c", "torch")) == DecodePath(linear=("torch", "c"))
    assert DecodePath(linear=["c", "torch"]).linear == ("torch", "c")  # type: ignore[arg-type]
    c = DecodePath.c(graphs="static")
    assert c.torch_variant() == DecodePath(linear=c.linear, graphs="static")
    assert DecodePath.triton().torch_variant() == REFERENCE


def test_the_fastest_path_on_a_cpu_is_the_c_kernels_where_they_build():
    expected = DecodePath.c() if cpu_paged_decode() is not None else DecodePath(linear=DecodePath.c().linear)
    assert fastest("cpu") == expected
    assert fastest("cpu", linear=("torch",)).linear == ("torch",)


def _decode(model: txl.TransfoXLLMHeadModel, path: DecodePath | None) -> torch.Tensor:
    """Log-probs of two decoding steps of 3 rows (on `path`; None: the model's default)."""
    given = {} if path is None else {"path": path}
    with torch.inference_mode():
        memory = model.empty_memory(3)
        _, memory = model(torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(1)), memory)
        out = []
        for t in range(2):
            hidden, memory = model(torch.full((3, 1), 5 + t), memory, **given)
            out.append(model.log_probs(hidden[:, -1], **given))
    return torch.stack(out)


@pytest.mark.skipif(cpu_paged_decode() is None, reason="no C compiler here")
def test_the_c_attention_kernel_runs_where_the_path_names_it_and_nowhere_else(monkeypatch):
    calls: list[int] = []
    call = paged_decode.PagedDecodeKernel.__call__

    def counted(self, *args):
        calls.append(1)
        return call(self, *args)

    monkeypatch.setattr(paged_decode.PagedDecodeKernel, "__call__", counted)
    model = tiny_model(seed=5)
    reference = _decode(model, None)  # the default: the reference
    assert calls == []
    got = _decode(model, DecodePath(attention="c"))
    assert len(calls) == 2 * model.config.n_layer  # each layer of each step
    torch.testing.assert_close(got, reference, rtol=0, atol=1e-5)


def test_the_triton_parts_run_where_the_path_names_them_and_nowhere_else(monkeypatch):
    """The adaptive embedding, the log-softmax and the sampler take their Triton kernels on a path that names
    them (each replaced here by torch's result, counted: no GPU needed), and torch's operations on any other."""
    calls: list[str] = []

    def embedding(tokens, *args):
        calls.append("embedding")
        return None  # "does not apply": torch's path computes it

    def softmax(logits, clusters):
        calls.append("softmax")
        return None

    def sample(log_probs, *args, readback=None, **kwargs):
        calls.append("sampler")
        tokens = log_probs.argmax(-1)
        return tokens, log_probs.gather(1, tokens[:, None])[:, 0]

    monkeypatch.setattr(triton_embedding, "adaptive_embedding", embedding)
    monkeypatch.setattr(triton_softmax, "adaptive_log_probs", softmax)
    monkeypatch.setattr(triton_sampling, "sample", sample)
    model = tiny_model(
        seed=6, vocab_size=300, cutoffs=[100]
    )  # clusters: the adaptive embedding's kernel applies
    tokens = torch.tensor([3, 150, 299])
    hidden = torch.randn(3, model.config.d_model, generator=torch.Generator().manual_seed(2))
    rows = RowParams.build([SamplingParams(temperature=0)] * 3, [1, 2, 3], [0, 0, 0], 300, "cpu")
    parts = DecodePath(embedding="triton", softmax="triton", sampler="triton")
    with torch.inference_mode():
        for path in (REFERENCE, DecodePath.c(), dataclasses.replace(parts, sampler="torch")):
            model.transformer.word_emb(tokens, path)
            sample_rows(model.log_probs(hidden, path), rows, path=path)
        assert calls == ["embedding", "softmax"]  # the last path's two Triton parts, and not its sampler
        calls.clear()
        log_probs = model.log_probs(hidden, parts)
        expected, _ = sample_rows(log_probs, rows)
        got, _ = sample_rows(log_probs, rows, path=parts)
    assert calls == ["softmax", "sampler"] and torch.equal(got, expected)
