"""Byte-level tokenizer: a token is one byte of UTF-8, so any text is encodable and nothing is ever unknown."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

VOCAB_SIZE = 256


class ByteDecoder:
    """Holds back an incomplete UTF-8 sequence until its last byte arrives; invalid bytes become U+FFFD."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(bytes((token_id,)))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)

    @property
    def has_pending(self) -> bool:
        """Whether bytes of an incomplete character are held back."""
        return bool(self._utf8.getstate()[0])


class ByteTokenizer:
    vocab_size = VOCAB_SIZE
    eos_id: int | None = None

    def encode(self, text: str) -> list[int]:
        # surrogatepass: lone surrogates (possible in JSON strings) still encode, as their 3-byte forms.
        return list(text.encode("utf-8", errors="surrogatepass"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def decoder(self, previous: Sequence[int] = ()) -> ByteDecoder:
        return ByteDecoder()

    def token_text(self, token_id: int) -> str:
        """The character if the byte is ASCII, else its hex escape (one byte of a multi-byte character)."""
        return chr(token_id) if token_id < 0x80 else f"\\x{token_id:02x}"

    def to_json(self) -> dict:
        return {"type": "byte", "vocab_size": VOCAB_SIZE}
