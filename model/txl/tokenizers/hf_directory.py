"""An HF Transformer-XL tokenizer directory, read as transformers 4.35.2 reads it: our tokenizer description.

The vocabulary comes from `vocab.pkl` (or `vocab.bin`, see `vocab_pickle.py`). The added-token table (see
`added.py`) is assembled in HF's order: the one pickled with the vocabulary, then over it by id the
`added_tokens_decoder` of `tokenizer_config.json`, or, where that file has none, the legacy `added_tokens.json`
(`{"content": id}`).

One departure: HF encodes a table entry whose id lies past the vocabulary with that id, which no model of that
vocabulary can take (HF itself warns that such embeddings are untrained). Such a token is still cut out of the
text as HF cuts it, but takes the vocabulary's id for its text (or the unknown-word id).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .added import AddedToken, changes_encoding, effective_table
from .base import TokenizerError
from .vocab_pickle import VocabFileError, load_hf_vocab, pickled_added_tokens, spec_from_hf_vocab

CONFIG_NAME = "tokenizer_config.json"
LEGACY_ADDED_NAME = "added_tokens.json"


def _json_object(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return value


def saved_added_tokens(directory: Path, special_tokens: set[str]) -> dict[int, AddedToken]:
    """The table the directory's JSON files give (empty where they give none)."""
    config = _json_object(directory / CONFIG_NAME)
    if config is not None and "added_tokens_decoder" in config:
        decoder = config["added_tokens_decoder"]
        where = f" in {directory / CONFIG_NAME}"
        if not isinstance(decoder, dict) or not all(key.isdigit() for key in decoder):
            raise TokenizerError(f"'added_tokens_decoder'{where} must map ids to tokens")
        return {
            int(key): AddedToken.from_json({**entry, "id": int(key)}, where) for key, entry in decoder.items()
        }
    legacy = _json_object(directory / LEGACY_ADDED_NAME)
    if legacy is None:
        return {}
    where = f" in {directory / LEGACY_ADDED_NAME}"
    table = {}
    for content, token_id in legacy.items():
        special = content in special_tokens  # HF's rule for this file
        table[token_id] = AddedToken.from_json(
            {"content": content, "id": token_id, "special": special, "normalized": not special}, where
        )
    return table


def read_hf_tokenizer(vocab_path: Path) -> dict:
    """Our tokenizer description (`WordTokenizer.to_json`) from an HF vocabulary file and the files beside it;
    errors name the file."""
    state = load_hf_vocab(vocab_path)
    try:
        spec = spec_from_hf_vocab(state)
        table = pickled_added_tokens(state)
    except (VocabFileError, TokenizerError) as exc:
        raise VocabFileError(f"{vocab_path}: {exc}") from None
    special_tokens = {spec["eos_token"], spec["unk_token"], *spec["additional_special_tokens"]}
    table.update(saved_added_tokens(vocab_path.parent, special_tokens))
    vocab = {symbol: i for i, symbol in enumerate(spec["vocab"])}
    added = [t.to_json() for t in effective_table(table) if changes_encoding(t, vocab, special_tokens)]
    if added:
        spec["added_tokens"] = added
    return spec
