"""Tiny txl models with random weights, saved and loaded for real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import txl


def tiny_model(seed: int = 0, weight_scale: float = 0.3, **overrides: Any) -> txl.TransfoXLLMHeadModel:
    """A random tiny model; weights larger than a fresh init so every term matters to the output."""
    model = txl.TransfoXLLMHeadModel(txl.TxlConfig.tiny(**overrides))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = weight_scale * torch.randn(param.shape, generator=generator)
            param.copy_(1 + noise if "layer_norm.weight" in name else noise)
    return model.eval()


def saved_tiny_model(path: Path, **overrides: Any) -> Path:
    txl.save_pretrained(tiny_model(**overrides), path)
    return path
