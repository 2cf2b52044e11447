"""What the next forward runs: every decoding row, and segments of ingesting jobs under a token budget.

Each iteration is one forward (vLLM's and SGLang's continuous batching with chunked prefill): all decoding rows
(up to `max_batch_size`; beyond it they take turns) feed one token each, and ingesting jobs (prompts, appends,
scoring) feed their next segment beside them, round robin, while the iteration's tokens stay within
`max_batch_tokens`. A job feeds at most one segment per iteration (its next segment needs the memory this one
makes), so a long append delays the other rows by one segment per iteration, never by the whole text. At least
one segment runs whenever one waits, so ingestion progresses even under a full decode batch.

Pure bookkeeping over anything with a `pending` token count: testable without a model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Ingesting(Protocol):
    @property
    def pending(self) -> int:
        """Input tokens not yet fed."""
        ...

    @property
    def chunk_limit(self) -> int:
        """The most tokens its next segment may feed (a job may want its segments to end at given positions)."""
        ...


D = TypeVar("D")
I = TypeVar("I", bound=Ingesting)  # noqa: E741 - mirrors D


@dataclass(frozen=True)
class Iteration(Generic[D, I]):
    decode: list[D]  # rows that sample a token and feed it
    chunks: list[tuple[I, int]]  # (job, tokens of its input it feeds now)

    @property
    def tokens(self) -> int:
        return len(self.decode) + sum(n for _, n in self.chunks)

    def __bool__(self) -> bool:
        return bool(self.decode or self.chunks)


class Scheduler:
    def __init__(self, *, segment_len: int, max_batch_size: int, max_batch_tokens: int) -> None:
        if min(segment_len, max_batch_size, max_batch_tokens) < 1:
            raise ValueError("segment_len, max_batch_size and max_batch_tokens must be >= 1")
        self.segment_len = segment_len
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens

    def next(self, decoding: list[D], ingesting: deque[I]) -> Iteration[D, I]:
        """Picks this iteration's work and rotates both queues so that the rows that ran go to the back."""
        decode = decoding[: self.max_batch_size]
        del decoding[: len(decode)]
        decoding.extend(decode)
        budget = self.max_batch_tokens - len(decode)
        chunks: list[tuple[I, int]] = []
        for job in list(ingesting):
            if len(chunks) >= self.max_batch_size:
                break
            size = min(self.segment_len, job.pending, job.chunk_limit)
            if size > budget and chunks:
                break
            chunks.append((job, size))
            budget -= size
            if budget <= 0:
                break
        ingesting.rotate(-len(chunks))
        return Iteration(decode, chunks)
