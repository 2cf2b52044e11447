"""Tokenizers: byte-level (the bundled model) and the word-level Transformer-XL vocabulary (transfo-xl-wt103).

A model directory describes its tokenizer in `tokenizer.json` (`{"type": "byte"}` or `{"type": "word", ...}`);
`load_tokenizer(model_dir)` reads it. No tokenizer ever unpickles a file: HF's `vocab.pkl` is converted once to
JSON by `txl.tokenizers.word.convert_hf_vocab` with a restricted unpickler.
"""

from __future__ import annotations

import json
from pathlib import Path

from .base import TOKENIZER_NAME, IncrementalDecoder, Tokenizer, TokenizerError
from .byte import ByteTokenizer

# HF's word-level vocabulary files, read (safely) when a directory has no tokenizer.json yet.
HF_VOCAB_NAMES = ("vocab.pkl", "vocab.bin")


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """The tokenizer of a model directory: its `tokenizer.json`, or else an HF `vocab.pkl`/`vocab.bin`, read with the
    restricted unpickler, with the added-token table HF keeps beside it (so a downloaded `transfo-xl-wt103` directory
    serves as it is; `txl convert` makes the JSON once and for all)."""
    path = Path(model_dir) / TOKENIZER_NAME
    if not path.is_file():
        for name in HF_VOCAB_NAMES:
            if (Path(model_dir) / name).is_file():
                from .hf_directory import read_hf_tokenizer
                from .word import WordTokenizer

                return WordTokenizer.from_json(read_hf_tokenizer(Path(model_dir) / name))
        raise TokenizerError(f"{path} not found: a model directory needs a tokenizer description")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path} is not valid JSON: {exc}") from exc
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "byte":
        return ByteTokenizer()
    if kind == "word":
        from .word import WordTokenizer

        return WordTokenizer.from_json(spec, base_dir=Path(model_dir))
    raise TokenizerError(f"{path}: unknown tokenizer type {kind!r} (expected 'byte' or 'word')")


def save_tokenizer(tokenizer: Tokenizer, model_dir: str | Path) -> None:
    path = Path(model_dir) / TOKENIZER_NAME
    path.write_text(json.dumps(tokenizer.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


__all__ = [
    "TOKENIZER_NAME",
    "ByteTokenizer",
    "IncrementalDecoder",
    "Tokenizer",
    "TokenizerError",
    "load_tokenizer",
    "save_tokenizer",
]
