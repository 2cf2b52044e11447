"""What a decoding kernel reads of its rows besides the pool: block tables and windows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor


class DecodeRows(Protocol):
    """Per row: its block table [B, S], its first position's offset in its first block [B], the positions its
    query sees [B], and its same_length window [B] (`txl.paged.step.QueryGroup` is one)."""

    @property
    def table(self) -> Tensor: ...

    @property
    def starts(self) -> Tensor: ...

    @property
    def key_lengths(self) -> Tensor: ...

    @property
    def windows(self) -> Tensor: ...


@dataclass(frozen=True)
class GivenRows:
    """Rows given outright (the warm-ups' dummy rows): a `DecodeRows`."""

    table: Tensor
    starts: Tensor
    key_lengths: Tensor
    windows: Tensor
