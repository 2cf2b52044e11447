"""HF's added tokens: text that tokenises as one piece, with the id HF gives it (transformers 4.35.2).

Beside its vocabulary, an HF tokenizer keeps a table of added tokens, its special tokens among them. Text is cut
at every added token before Moses sees it, and an added token's id comes from the table before the vocabulary.
The two can disagree: a `TransfoXLTokenizer` built from scratch registers `<eos>`, `<unk>` and `<formula>` while
its vocabulary is still empty (ids 0, 1, 2), so the text `<unk>` encodes as id 1, whatever word the vocabulary
puts there. A directory saved by HF carries the table (in `vocab.pkl` and `tokenizer_config.json`), and HF
honours it when it loads the directory, so a model trained through HF saw those ids.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .base import TokenizerError

_FLAGS = ("special", "normalized", "lstrip", "rstrip", "single_word")


@dataclass(frozen=True)
class AddedToken:
    """One entry of the table, with HF's flags: `lstrip`/`rstrip` eat the spaces beside the token,
    `single_word` keeps it whole only between spaces, and with lower-casing on, `normalized` tokens that are not
    special keep their case (HF's slow tokenizers)."""

    content: str
    id: int
    special: bool = False
    normalized: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any, where: str = "") -> AddedToken:
        """An entry of our `tokenizer.json` or of HF's `added_tokens_decoder` (`id` given separately there)."""
        if not isinstance(value, dict):
            raise TokenizerError(f"added token{where}: expected an object, got {value!r}")
        content, token_id = value.get("content"), value.get("id")
        if not isinstance(content, str) or not content:
            raise TokenizerError(f"added token{where}: 'content' must be a non-empty string")
        if type(token_id) is not int or token_id < 0:
            raise TokenizerError(f"added token {content!r}{where}: 'id' must be an integer >= 0")
        flags = {name: value[name] for name in _FLAGS if name in value}
        if not all(isinstance(flag, bool) for flag in flags.values()):
            raise TokenizerError(f"added token {content!r}{where}: {', '.join(_FLAGS)} must be true or false")
        flags.setdefault("normalized", not flags.get("special", False))  # HF's default
        return cls(content, token_id, **flags)


def effective_table(table: dict[int, AddedToken]) -> list[AddedToken]:
    """The tokens HF encodes with, from its `_added_tokens_decoder` (id -> token): one per content, the last one
    given winning, as in HF's `{token.content: id for id, token in decoder.items()}`."""
    by_content = {token.content: AddedToken(**{**token.to_json(), "id": i}) for i, token in table.items()}
    return list(by_content.values())


def changes_encoding(token: AddedToken, vocab: dict[str, int], special_tokens: set[str]) -> bool:
    """Whether an entry makes some text encode otherwise than the vocabulary and the special tokens alone do.
    The others are left out of our JSON, so a directory whose table only repeats the vocabulary converts as it
    did before tables were read. (Special tokens are cut out and kept in case whatever their entry says.)"""
    if token.lstrip or token.rstrip or token.single_word or token.content not in special_tokens:
        return True
    return token.id < len(vocab) and vocab.get(token.content) != token.id
