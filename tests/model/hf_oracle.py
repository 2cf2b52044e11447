"""The test oracle: reference models and tokenizers of HF transformers 4.35.2, built at random and saved as users
have them. A test that needs one is skipped where transformers is not installed."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.tiny_models import randomize

# The reference model's shape, in HF's names (the txl config's too): adaptive, with two tail clusters; and
# dropout on, so that a reference left in training mode would show.
HF_VOCABULARY = dict(vocab_size=97, cutoffs=[17, 45], div_val=2)
HF_SIZES = dict(d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=48, n_layer=3)
HF_MEMORY = dict(mem_len=12, tgt_len=8, clamp_len=1000, same_length=False, dropout=0.1)


def transformers() -> Any:
    """The transformers module, quiet; skips the test where it is not installed."""
    module = pytest.importorskip(
        "transformers", reason="the HF reference (transformers==4.35.2) is not installed"
    )
    warnings.filterwarnings("ignore", module="transformers")
    return module


def hf_model(seed: int = 0, weight_scale: float = 0.2, **config: Any):
    """A random HF TransfoXLLMHeadModel in eval mode. Weights are drawn larger than HF's init so that
    a wrong term in any layer moves the log-probabilities well beyond the parity tolerance."""
    hf = transformers()
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shape = {**HF_VOCABULARY, **HF_SIZES, **HF_MEMORY, **config}
        model = hf.TransfoXLLMHeadModel(hf.TransfoXLConfig(**shape)).eval()
    randomize(model, seed=seed, weight_scale=weight_scale)
    return model


def hf_tokenizer(**kwargs: Any):
    """HF's TransfoXLTokenizer, made with `kwargs`."""
    hf = transformers()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.TransfoXLTokenizer(**kwargs)


def save_hf(model, path: Path, *, safe: bool) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(str(path), safe_serialization=safe)
    return path


def hf_empty_mems(model, batch_size: int) -> list[torch.Tensor]:
    d_model = model.config.d_model
    return [torch.empty(0, batch_size, d_model) for _ in range(model.config.n_layer)]
