"""A tokenizer written out as a directory that HF transformers loads (`AutoTokenizer.from_pretrained(DIR)`), for
tools that tokenize locally (load generators such as AIPerf and GuideLLM, lm-evaluation-harness with its
`huggingface` backend), and the `tokenizer_config.json` it holds, which the server also answers on
`GET /tokenizer_info` (vLLM's route).

Nothing here imports transformers: the files are plain JSON and text, checked against transformers in the tests.

- Byte-level: a fast tokenizer (`tokenizer.json`) whose pre-tokenizer writes each UTF-8 byte as one of GPT-2's 256
  byte characters, with a BPE model of those 256 characters (id = the byte) and no merges, so any text encodes
  to its bytes, exactly as `ByteTokenizer.encode`.
- Word-level: HF's own `TransfoXLTokenizer` (the Moses pipeline this tokenizer reproduces), read from `vocab.txt`
  (one symbol per line; never a pickle) with the added-token table in `tokenizer_config.json`. It encodes each
  line exactly as the server does; the server also writes each line break as `<eos>` (the WikiText convention),
  which HF's tokenizer drops, so a multi-line text is its lines' ids joined by the `<eos>` id
  (`TransfoXLTokenizer` has no way to map a text piece to an id its vocabulary gives another symbol).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import Tokenizer, TokenizerError
from .byte import VOCAB_SIZE, ByteTokenizer

HF_TOKENIZER_FILE = "tokenizer.json"  # a fast tokenizer's file: the byte-level export's only tokenizer file
HF_CONFIG_FILE = "tokenizer_config.json"
HF_VOCAB_FILE = "vocab.txt"  # TransfoXLTokenizer's plain-text vocabulary


def gpt2_byte_characters() -> list[str]:
    """The character GPT-2's byte-level alphabet writes each byte as (index = byte): printable bytes as
    themselves, the others shifted past U+00FF, as HF tokenizers' `ByteLevel` pre-tokenizer does."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(VOCAB_SIZE):
        if b not in chars:
            chars[b] = chr(VOCAB_SIZE + shifted)
            shifted += 1
    return [chars[b] for b in range(VOCAB_SIZE)]


def _byte_level() -> dict[str, Any]:
    # No regex split, no prefix space: the whole text is one piece, written byte by byte.
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def byte_tokenizer_json() -> dict[str, Any]:
    """The fast tokenizer (`tokenizers` format 1.0) that encodes text to its UTF-8 bytes, id = byte."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": _byte_level(),
        "post_processor": None,
        "decoder": _byte_level(),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": {char: byte for byte, char in enumerate(gpt2_byte_characters())},
            "merges": [],
        },
    }


def tokenizer_config(
    tokenizer: Tokenizer, *, model_max_length: int, chat_template: str | None = None
) -> dict[str, Any]:
    """HF's `tokenizer_config.json` for `tokenizer`: its class, special tokens and the longest input the server
    takes; `chat_template` (Jinja, as HF's `apply_chat_template` reads it) where the server has one."""
    config: dict[str, Any] = {
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "eos_token": None,
        "bos_token": None,
        "pad_token": None,
        "unk_token": None,
    }
    if isinstance(tokenizer, ByteTokenizer):
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    else:
        from .word import WordTokenizer

        assert isinstance(tokenizer, WordTokenizer)
        config.update(
            tokenizer_class="TransfoXLTokenizer",
            eos_token=tokenizer.eos_token,
            unk_token=tokenizer.unk_token,
            additional_special_tokens=tokenizer.additional_special_tokens,
            lower_case=tokenizer.lower_case,
            language=tokenizer.language,
        )
        if tokenizer.added_tokens:
            config["added_tokens_decoder"] = {
                str(t.id): {k: v for k, v in t.to_json().items() if k != "id"} for t in tokenizer.added_tokens
            }
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config


def export_hf_tokenizer(
    tokenizer: Tokenizer, directory: str | Path, *, model_max_length: int, chat_template: str | None = None
) -> list[Path]:
    """Writes `tokenizer` as an HF tokenizer directory (made if missing); returns the files written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    if isinstance(tokenizer, ByteTokenizer):
        files[HF_TOKENIZER_FILE] = json.dumps(byte_tokenizer_json(), ensure_ascii=False, indent=1)
    else:
        from .word import WordTokenizer

        assert isinstance(tokenizer, WordTokenizer)
        unreadable = [s for s in tokenizer.vocab if s.split() != [s]]
        if unreadable:  # HF reads the first whitespace-separated word of each line
            raise TokenizerError(f"vocabulary symbols with whitespace cannot be exported: {unreadable[:3]!r}")
        files[HF_VOCAB_FILE] = "".join(f"{symbol}\n" for symbol in tokenizer.vocab)
    config = tokenizer_config(tokenizer, model_max_length=model_max_length, chat_template=chat_template)
    files[HF_CONFIG_FILE] = json.dumps(config, ensure_ascii=False, indent=2)
    written = []
    for name, text in files.items():
        path = out / name
        path.write_text(text + ("" if text.endswith("\n") else "\n"), encoding="utf-8")
        written.append(path)
    return written
