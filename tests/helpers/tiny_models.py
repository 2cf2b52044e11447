"""Tiny txl models with random weights, made by the tests themselves and saved for real (no downloads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import txl
from txl.tokenizers import ByteTokenizer, save_tokenizer

# The byte-level model the server tests serve: one softmax over the 256 bytes (no adaptive clusters), and a little
# wider than TxlConfig.tiny().
BYTE_VOCABULARY = dict(vocab_size=256, cutoffs=[], div_val=1)
BYTE_SIZES = dict(d_model=32, d_embed=32, n_head=4, d_inner=64, mem_len=32)


def randomize(model: torch.nn.Module, *, seed: int, weight_scale: float) -> None:
    """Weights larger than a fresh init (layer norms around 1), so that every term moves the output."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = weight_scale * torch.randn(param.shape, generator=generator)
            param.copy_(1 + noise if "layer_norm.weight" in name else noise)


def tiny_model(seed: int = 0, weight_scale: float = 0.3, **overrides: Any) -> txl.TransfoXLLMHeadModel:
    """A random model of `TxlConfig.tiny(**overrides)`, in eval mode."""
    model = txl.TransfoXLLMHeadModel(txl.TxlConfig.tiny(**overrides))
    randomize(model, seed=seed, weight_scale=weight_scale)
    return model.eval()


def saved_tiny_model(path: Path, **overrides: Any) -> Path:
    txl.save_pretrained(tiny_model(**overrides), path)
    return path


def make_byte_model_dir(path: Path, *, seed: int = 0, **overrides: Any) -> Path:
    """A model directory a server loads: the byte-level model's weights, config and tokenizer."""
    txl.save_pretrained(tiny_model(seed, **{**BYTE_VOCABULARY, **BYTE_SIZES, **overrides}), path)
    save_tokenizer(ByteTokenizer(), path)
    return path


def make_text_model_dir(path: Path, *, seed: int = 0) -> Path:
    """The byte model, writing only printable ASCII and newlines: its text is its bytes, so a reply fed back as
    text is the tokens it was (random bytes would come back as U+FFFD)."""
    make_byte_model_dir(path, seed=seed)
    model = txl.load_pretrained(path)
    printable = torch.zeros(256, dtype=torch.bool)
    printable[32:127] = printable[10] = True
    with torch.no_grad():
        model.crit.out_layers[0].bias[~printable] = -1e4
    txl.save_pretrained(model, path)
    return path


def make_word_model_dir(path: Path, lines: list[str], *, seed: int = 0) -> Path:
    """A model directory a server loads: a word-level model whose vocabulary is built from `lines` (already
    tokenised, as WikiText), with `<formula>` in it."""
    from txl.tokenizers.word import WordTokenizer

    tokenizer = WordTokenizer.build_vocab(lines, special=("<eos>", "<formula>"))
    sizes = {**BYTE_SIZES, "vocab_size": tokenizer.vocab_size, "cutoffs": [], "div_val": 1}
    txl.save_pretrained(tiny_model(seed, **sizes), path)
    save_tokenizer(tokenizer, path)
    return path
