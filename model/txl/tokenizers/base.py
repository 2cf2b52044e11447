"""What every tokenizer offers: text <-> ids, and incremental decoding for streaming.

Streaming contract: for any ids, `"".join(d.push(i) for i in ids) + d.flush()` equals `decode(ids)` where `d`
is `decoder()`. A server streams the pushes and returns the join as the non-streamed text, so both agree by
construction. A decoder may hold text back (an incomplete UTF-8 sequence) until later ids settle it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

TOKENIZER_NAME = "tokenizer.json"  # a model directory's tokenizer description


class TokenizerError(ValueError):
    """A model directory's tokenizer description is missing or malformed."""


class IncrementalDecoder(Protocol):
    def push(self, token_id: int) -> str:
        """Text that becomes final with this token (possibly empty)."""
        ...

    def flush(self) -> str:
        """Text still held back, at the end of the stream."""
        ...

    @property
    def has_pending(self) -> bool:
        """Whether text is held back (flush would return something)."""
        ...


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def decoder(self, previous: Sequence[int] = ()) -> IncrementalDecoder:
        """A decoder for ids that follow `previous` (the context; spacing may depend on its last token)."""
        ...

    def token_text(self, token_id: int) -> str:
        """A readable form of one token on its own (for per-token displays; not for joining)."""
        ...

    def to_json(self) -> dict: ...
