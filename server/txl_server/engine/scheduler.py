"""What the next forward runs: every decoding row, and segments of ingesting jobs under a token budget, as far
as the memory pool has the blocks for them; and, when nothing fits for too long, which job is preempted.

Each iteration is one forward (vLLM's and SGLang's continuous batching with chunked prefill): all decoding rows
(up to `max_batch_size`; beyond it they take turns) feed one token each, and ingesting jobs (prompts, appends,
scoring) feed their next segment beside them, round robin, while the iteration's tokens stay within
`max_batch_tokens`. A job feeds at most one segment per iteration (its next segment needs the memory this one
makes), so a long append delays the other rows by one segment per iteration, never by the whole text. At least
one segment runs whenever one waits, so ingestion progresses even under a full decode batch.

A pool that never grows (a GPU's) holds what runs: the rows whose new blocks it lacks wait for a later
iteration, and if nothing can run for PREEMPT_AFTER_SECONDS, the youngest job is preempted (as vLLM preempts its
newest requests) so that the others finish. The block pool holds no policy; the worker runs what this decides.

Bookkeeping over anything with a token count and a block need (`Decoding`, `Ingesting`): testable without a
model.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

# With a pool that may not grow: how long nothing may run for lack of blocks before a job is preempted, and how
# often, meanwhile, the cycle collector is run to free blocks that only a reference cycle still holds.
PREEMPT_AFTER_SECONDS = 2.0
COLLECT_INTERVAL_SECONDS = 0.1


class Decoding(Protocol):
    """A job sampling one token per iteration."""

    @property
    def arrival(self) -> int:
        """Its place in the order jobs arrived (the largest is the youngest)."""
        ...

    @property
    def cancelled(self) -> bool: ...

    def new_blocks(self, tokens: int, claimed: set[int]) -> int:
        """The fresh blocks its next row takes from the pool to add `tokens` positions (`claimed`: the partly
        filled blocks this iteration's rows extend in place, which a later row sharing one must copy)."""
        ...


class Ingesting(Decoding, Protocol):
    """A job feeding its input, segment by segment."""

    @property
    def pending(self) -> int:
        """Input tokens not yet fed."""
        ...

    @property
    def chunk_limit(self) -> int:
        """The most tokens its next segment may feed (a job may want its segments to end at given positions)."""
        ...


class BlockSpace(Protocol):
    """The memory pool, as far as the scheduler looks at it."""

    @property
    def growable(self) -> bool: ...

    @property
    def available_blocks(self) -> int: ...


D = TypeVar("D", bound=Decoding)
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


@dataclass(frozen=True)
class Schedule(Generic[D, I]):
    """One iteration's decision."""

    iteration: Iteration[D, I]  # what runs now (empty: nothing fits, or nothing waits)
    lacking: int  # blocks the rows left out need: idle sessions may be moved off the device to free them
    preempt: D | I | None  # to end with a retryable error now, so that the others finish (still queued)


class Scheduler(Generic[D, I]):
    def __init__(
        self,
        *,
        segment_len: int,
        max_batch_size: int,
        max_batch_tokens: int,
        pool: BlockSpace,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min(segment_len, max_batch_size, max_batch_tokens) < 1:
            raise ValueError("segment_len, max_batch_size and max_batch_tokens must be >= 1")
        self.segment_len = segment_len
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.pool = pool
        self.clock = clock
        self.decoding: list[D] = []
        self.ingesting: deque[I] = deque()
        self._starved_since: float | None = None
        self._collected_at = 0.0

    # ------------------------------------------------------------------ the jobs it holds

    @property
    def active(self) -> int:
        return len(self.ingesting) + len(self.decoding)

    def add_ingesting(self, task: I) -> None:
        self.ingesting.append(task)

    def add_decoding(self, task: D) -> None:
        self.decoding.append(task)

    def remove_ingesting(self, task: I) -> None:
        self.ingesting.remove(task)

    def remove_decoding(self, task: D) -> None:
        self.decoding.remove(task)

    def drop_cancelled(self) -> list[D | I]:
        """Takes the cancelled jobs out of the queues, and returns them (ingesting ones first)."""
        cancelled: list[D | I] = [t for t in self.ingesting if t.cancelled]
        cancelled += [t for t in self.decoding if t.cancelled]
        if cancelled:
            self.ingesting = deque(t for t in self.ingesting if not t.cancelled)
            self.decoding = [t for t in self.decoding if not t.cancelled]
        return cancelled

    # ------------------------------------------------------------------ one iteration

    def schedule(self) -> Schedule[D, I]:
        """This iteration: `next`, less what the pool has no blocks for (all of it where the pool may grow)."""
        iteration = self.next()
        if self.pool.growable or not iteration:
            self._starved_since = None
            return Schedule(iteration, 0, None)
        fitted, lacking = self.fit(iteration)
        now = self.clock()
        if not fitted and now - self._collected_at >= COLLECT_INTERVAL_SECONDS:
            # Blocks are freed when the last table holding them goes; one held by a reference cycle (a failed
            # request's traceback) goes only when the cycle collector runs.
            self._collected_at = now
            gc.collect()
            fitted, lacking = self.fit(iteration)
        preempt = None
        if fitted:
            self._starved_since = None
        elif self._starved_since is None:
            self._starved_since = now
        elif now - self._starved_since >= PREEMPT_AFTER_SECONDS:
            preempt = self.youngest()
            self._starved_since = None
        return Schedule(fitted, lacking, preempt)

    def next(self) -> Iteration[D, I]:
        """Picks this iteration's work and rotates both queues so that the rows that ran go to the back."""
        decoding, ingesting = self.decoding, self.ingesting
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

    def fit(self, iteration: Iteration[D, I]) -> tuple[Iteration[D, I], int]:
        """The rows of `iteration` whose new blocks are free now (in order), and the blocks the others need."""
        free = self.pool.available_blocks
        claimed: set[int] = set()  # blocks a row of this iteration extends in place: others sharing them copy
        lacking = 0
        decode: list[D] = []
        chunks: list[tuple[I, int]] = []
        for task in iteration.decode:
            need = task.new_blocks(1, claimed)
            if need <= free:
                decode.append(task)
                free -= need
            else:
                lacking += need
        for ingest, n in iteration.chunks:
            need = ingest.new_blocks(n, claimed)
            if need <= free:
                chunks.append((ingest, n))
                free -= need
            else:
                lacking += need
        return Iteration(decode, chunks), lacking

    def youngest(self) -> D | I | None:
        """The job that arrived last (the one preempted)."""
        tasks: list[D | I] = [*self.ingesting, *self.decoding]
        return max(tasks, key=lambda t: t.arrival) if tasks else None
