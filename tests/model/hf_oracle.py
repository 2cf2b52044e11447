"""Builds reference models with HF transformers 4.35.2 (the test oracle) and saves them as users have them."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the HF reference (transformers==4.35.2) is not installed"
)
warnings.filterwarnings("ignore", module="transformers")


def hf_model(seed: int = 0, weight_scale: float = 0.2, **config: Any):
    """A random HF TransfoXLLMHeadModel in eval mode. Weights are drawn larger than HF's init so that
    a wrong term in any layer moves the log-probabilities well beyond the parity tolerance."""
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    base: dict[str, Any] = dict(
        vocab_size=97,
        cutoffs=[17, 45],
        d_model=32,
        d_embed=32,
        n_head=4,
        d_head=8,
        d_inner=48,
        div_val=2,
        n_layer=3,
        mem_len=12,
        tgt_len=8,
        clamp_len=1000,
        same_length=False,
        dropout=0.1,
    )
    base.update(config)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TransfoXLLMHeadModel(TransfoXLConfig(**base)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm.weight" in name:
                param.copy_(1 + weight_scale * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(weight_scale * torch.randn(param.shape, generator=generator))
    return model


def save_hf(model, path: Path, *, safe: bool) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(str(path), safe_serialization=safe)
    return path


def hf_empty_mems(model, batch_size: int) -> list[torch.Tensor]:
    d_model = model.config.d_model
    return [torch.empty(0, batch_size, d_model) for _ in range(model.config.n_layer)]
