"""The model is the same function as HF transformers 4.35.2 TransfoXLLMHeadModel (the reference)."""

from __future__ import annotations

import pytest
import torch
import txl

from .hf_oracle import hf_empty_mems, hf_model, save_hf

pytestmark = pytest.mark.oracle

# Random tiny configs covering every architectural switch.
CONFIGS = {
    "adaptive-div2": dict(cutoffs=[17, 45], div_val=2),
    "adaptive-div4-untied-projs": dict(
        cutoffs=[17, 45], div_val=4, d_embed=64, proj_share_all_but_first=False
    ),
    "adaptive-div1-dembed": dict(cutoffs=[17, 45], div_val=1, d_embed=24),
    "adaptive-div1-same-dim": dict(cutoffs=[30], div_val=1),
    "plain-softmax": dict(cutoffs=[], div_val=1, vocab_size=64),
    "plain-softmax-untied-emb": dict(cutoffs=[], div_val=1, vocab_size=64, tie_word_embeddings=False),
    "shared-r-bias": dict(untie_r=False),
    "pre-lnorm": dict(pre_lnorm=True),
    "same-length": dict(same_length=True, mem_len=6),
    "small-clamp": dict(clamp_len=3),
    "same-length-pre-lnorm-clamp-div1": dict(
        same_length=True, pre_lnorm=True, clamp_len=5, div_val=1, d_embed=20
    ),
    "untied-everything": dict(tie_word_embeddings=False, proj_share_all_but_first=False, div_val=2),
}


def _run_txl(model: txl.TransfoXLLMHeadModel, tokens: torch.Tensor, segments: list[int], grid=None):
    memory = model.empty_memory(tokens.size(0), keep_hidden=True, grid=grid)
    outputs = []
    start = 0
    for length in segments:
        with torch.inference_mode():
            hidden, memory = model(tokens[:, start : start + length], memory)
            outputs.append(model.log_probs(hidden))
        start += length
    return torch.cat(outputs, dim=1), memory


def _run_hf(model, tokens: torch.Tensor, segments: list[int]):
    mems = hf_empty_mems(model, tokens.size(0))  # explicitly empty, not HF's default of zeros
    outputs = []
    start = 0
    for length in segments:
        with torch.no_grad():
            out = model(tokens[:, start : start + length], mems=mems)
        outputs.append(out.prediction_scores)
        mems = out.mems
        start += length
    return torch.cat(outputs, dim=1), mems


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_matches_reference_over_one_and_three_segments(name, safe, tmp_path):
    reference = hf_model(seed=len(name), **CONFIGS[name])
    model = txl.load_pretrained(save_hf(reference, tmp_path / "ckpt", safe=safe))
    vocab = reference.config.vocab_size
    tokens = torch.randint(0, vocab, (2, 21), generator=torch.Generator().manual_seed(7))

    for segments in ([21], [7, 7, 7], [8, 5, 8]):
        ours, memory = _run_txl(model, tokens, segments)
        theirs, mems = _run_hf(reference, tokens, segments)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
        # The memory, exported in HF's hidden-state form, is HF's mems.
        for ours_layer, theirs_layer in zip(memory.hidden_states(), mems, strict=True):
            torch.testing.assert_close(ours_layer, theirs_layer.transpose(0, 1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["adaptive-div2", "same-length", "pre-lnorm"])
def test_windows_on_the_grid_are_the_reference_fed_segment_by_segment(name, tmp_path):
    """With windows on a grid of 7 (txl.window), any cut of the text is HF's function fed in segments of 7 from
    the start (the paper's evaluation setting)."""
    reference = hf_model(seed=len(name), **CONFIGS[name])
    model = txl.load_pretrained(save_hf(reference, tmp_path / "ckpt", safe=True))
    tokens = torch.randint(
        0, reference.config.vocab_size, (2, 21), generator=torch.Generator().manual_seed(8)
    )
    theirs, _ = _run_hf(reference, tokens, [7, 7, 7])
    for segments in ([21], [7, 7, 7], [8, 5, 8], [1] * 21):
        ours, _ = _run_txl(model, tokens, segments, grid=7)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_imported_hf_mems_continue_identically(tmp_path):
    reference = hf_model(seed=3, same_length=True, mem_len=10)
    model = txl.load_pretrained(save_hf(reference, tmp_path / "ckpt", safe=True))
    tokens = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(1))
    _, mems = _run_hf(reference, tokens[:, :16], [8, 8])
    with torch.no_grad():
        expected = reference(tokens[:, 16:], mems=mems).prediction_scores
    memory = model.memory_from_hidden([m.transpose(0, 1) for m in mems])
    with torch.inference_mode():
        hidden, _ = model(tokens[:, 16:], memory)
        torch.testing.assert_close(model.log_probs(hidden), expected, rtol=0, atol=1e-5)


def test_param_count_matches_reference():
    for name, overrides in CONFIGS.items():
        reference = hf_model(**overrides)
        config = txl.TxlConfig.from_dict(reference.config.to_dict())
        assert config.param_count() == sum(p.numel() for p in reference.parameters()), name
