"""What one forward takes and gives, row by row: a decoding row samples its next token and feeds it; a chunk row
feeds a segment of a job's input (scoring it, if asked). The runner and the graphs take and make these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor
from txl import Memory
from txl.sampling import SamplingParams

# (token id, log-prob) of the most likely tokens at one position, best first.
TopLogprobs = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class DecodeRow:
    memory: Memory  # one row
    last_hidden: Tensor  # [D]: predicts the token sampled now
    params: SamplingParams
    seed: int
    counter: int  # index of this token within its request
    top_logprobs: int = 0


@dataclass(frozen=True)
class ChunkRow:
    memory: Memory  # one row
    tokens: Sequence[int]
    last_hidden: Tensor | None  # [D]: predicts tokens[0] (None: nothing precedes it)
    score: bool = False  # log p of each token
    top_logprobs: int = 0  # with score: also the k most likely tokens at each position


# Not frozen: one is made per row and step, and a frozen one is slower to make (docs/benchmarks/engine-figures.md).
@dataclass(slots=True)
class DecodeOut:
    token: int
    logprob: float
    top: TopLogprobs | None
    memory: Memory
    last_hidden: Tensor


@dataclass(frozen=True)
class ChunkOut:
    memory: Memory
    last_hidden: Tensor
    logprobs: Tensor | None  # [T] float32 on the device; NaN for a first token nothing predicts
    top: list[TopLogprobs | None] | None  # per token, when asked for


def release_outputs(*outputs: Sequence[DecodeOut] | Sequence[ChunkOut]) -> None:
    """Gives back the memories of outputs nobody keeps (checks and measurements)."""
    for group in outputs:
        for out in group:
            out.memory.release()
