"""What the next forward runs: the decoding rows that have a place in the batch, and segments of ingesting jobs
under a token budget, as far as the memory pool has the blocks for them; and, when nothing fits for too long,
which job is preempted.

Each iteration is one forward (vLLM's and SGLang's continuous batching with chunked prefill): the decoding rows
that have a place feed one token each, and ingesting jobs (prompts, appends, scoring) feed their next segment
beside them, while the iteration's tokens stay within the budget. A job feeds at most one segment per iteration
(its next segment needs the memory this one makes), so a long append delays the other rows by one segment per
iteration, never by the whole text.

Who goes first is its request's class (admission.classes): a lower lane always (interactive, then flex, then
batch). Within a lane, the batch's rows are divided between tenants by weighted max-min fair shares, and prompt
segments go first to the tenants owed rows (holding fewer than their share, counting the rows their prompts open),
then to the tenant served least (virtual token counters, which count service only while another tenant has work
too; on a tie, as when a tenant joins, the one holding the fewest rows for its weight): admission.fair_share.
Within a tenant, priority before default, then arrival (round robin among equals for prompt segments).

A row keeps its place in the batch until it ends: rows beyond the cap wait, rather than every stream taking turns
(and every stream slowing down). A row leaves the batch only at a token boundary, when a higher lane or a tenant
below its fair share needs the place: its memory stays as it is in the pool, its sampling goes on from the same
seed and counter when it comes back (first, before rows that never ran), so its tokens are those it would have
had without the pause. With pacing (admission.pacing), the cap on rows and the prompt tokens beside them follow
the time-between-tokens target, and flex and batch prompts take at most a fifth of the time while streams
decode; without (tests, the server's checks), the cap is `max_batch_size` and the budget `max_batch_tokens`, and
at least one segment runs whenever one waits.

A pool that never grows (a GPU's) holds what runs: the rows whose new blocks it lacks wait for a later
iteration (blocks come back when their holders release them: commits, evictions, jobs that end), and if nothing
can run for PREEMPT_AFTER_SECONDS, a job is preempted (as vLLM preempts its newest requests) so that the others
finish: engine.preemption decides which, and whether it runs again from its input or fails. The block pool holds
no policy; the worker runs what this decides.

Bookkeeping over anything with a token count, a block need and a class (`Decoding`, `Ingesting`): testable
without a model.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ..admission.classes import Lane
from ..admission.fair_share import VirtualCounters, even, max_min_shares
from ..admission.pacing import Pacing

# With a pool that may not grow: how long nothing may run for lack of blocks before a job is preempted.
PREEMPT_AFTER_SECONDS = 2.0


class Classed(Protocol):
    """A job's request class, as the scheduler orders by it."""

    @property
    def tenant(self) -> str: ...

    @property
    def lane(self) -> Lane: ...

    @property
    def rank(self) -> int:
        """Within its tenant and lane: the smallest first (priority 0, default 1)."""
        ...

    @property
    def arrival(self) -> int:
        """Its place in the order jobs arrived (the largest is the youngest)."""
        ...

    @property
    def cancelled(self) -> bool: ...


class Decoding(Classed, Protocol):
    """A job sampling one token per iteration."""

    @property
    def produced(self) -> bool:
        """It has sampled a token already (it ran: it comes back before rows that never did)."""
        ...

    def new_blocks(self, tokens: int, claimed: set[int]) -> int:
        """The fresh blocks its next row takes from the pool to add `tokens` positions (`claimed`: the partly
        filled blocks this iteration's rows extend in place, which a later row sharing one must copy)."""
        ...


class Ingesting(Classed, Protocol):
    """A job feeding its input, segment by segment."""

    @property
    def pending(self) -> int:
        """Input tokens not yet fed."""
        ...

    @property
    def chunk_limit(self) -> int:
        """The most tokens its next segment may feed (a job may want its segments to end at given positions)."""
        ...

    @property
    def rows_after(self) -> int:
        """The decoding rows its request opens once this input is fed (a prompt's generations)."""
        ...

    def new_blocks(self, tokens: int, claimed: set[int]) -> int: ...


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
    preempt: D | I | None  # nothing could run for PREEMPT_AFTER_SECONDS: the youngest job (engine.preemption)


class Scheduler(Generic[D, I]):
    def __init__(
        self,
        *,
        segment_len: int,
        max_batch_size: int,
        max_batch_tokens: int,
        pool: BlockSpace,
        clock: Callable[[], float] = time.monotonic,
        weight: Callable[[str], float] = even,
    ) -> None:
        if min(segment_len, max_batch_size, max_batch_tokens) < 1:
            raise ValueError("segment_len, max_batch_size and max_batch_tokens must be >= 1")
        self.segment_len = segment_len
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.pool = pool
        self.clock = clock
        self.weight = weight
        self.pacing: Pacing | None = (
            None  # the time-between-tokens target's pacing (set before the worker starts)
        )
        self.counters = VirtualCounters(weight)
        self.decoding: list[D] = []
        self.ingesting: deque[I] = deque()
        self.in_batch: set[D] = set()  # the rows with a place in the batch (they keep it until they end)
        self.cap = max_batch_size  # the rows the batch may hold, as last paced
        self.rows_ended = 0  # decoding rows that left the queue (ended, failed or cancelled) so far
        self._picked = (0, 0)  # (decoding rows, prompt tokens) of the last iteration picked
        self._background_tokens = 0  # flex and batch prompt tokens among them
        self._streams = False  # whether interactive rows decoded in it
        self._starved_since: float | None = None
        self._lent = 0  # prompt tokens fed beyond the budgets, not yet repaid (`segments`)

    # ------------------------------------------------------------------ the jobs it holds

    @property
    def active(self) -> int:
        return len(self.ingesting) + len(self.decoding)

    def add_ingesting(self, task: I) -> None:
        self._join(task.tenant)
        self.ingesting.append(task)

    def add_decoding(self, task: D) -> None:
        self._join(task.tenant)
        self.decoding.append(task)

    def remove_ingesting(self, task: I) -> None:
        self.ingesting.remove(task)

    def remove_decoding(self, task: D) -> None:
        self.decoding.remove(task)
        self.in_batch.discard(task)
        self.rows_ended += 1

    def _join(self, tenant: str) -> None:
        """A tenant with no work here until now starts from the smallest counter of those waiting (VTC)."""
        waiting = {t.tenant for t in self.ingesting} | {t.tenant for t in self.decoding}
        if tenant not in waiting:
            self.counters.join(tenant, waiting)
            self.counters.forget(waiting | {tenant})

    def drop_cancelled(self) -> list[D | I]:
        """Takes the cancelled jobs out of the queues, and returns them (ingesting ones first)."""
        cancelled: list[D | I] = [t for t in self.ingesting if t.cancelled]
        cancelled += [t for t in self.decoding if t.cancelled]
        if cancelled:
            self.ingesting = deque(t for t in self.ingesting if not t.cancelled)
            self.rows_ended += len(self.decoding)
            self.decoding = [t for t in self.decoding if not t.cancelled]
            self.rows_ended -= len(self.decoding)
            self.in_batch = {t for t in self.in_batch if not t.cancelled}
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
        """Picks this iteration's work: the rows with a place in the batch, then prompt segments in the budget
        left; the jobs whose segments run go to the back of their queue (round robin among equals)."""
        decode = self.rows()
        streams = any(t.lane is Lane.INTERACTIVE for t in decode)
        chunks = self.segments(len(decode), streams)
        # The counters compare tenants that have work at the same time: what one is served while no other has any
        # is no debt (a lone client served alone for a while would otherwise wait behind every prompt of a crowd
        # arriving after it, until the crowd had been served as much).
        if len({t.tenant for t in self.decoding} | {j.tenant for j in self.ingesting}) > 1:
            for task in decode:
                self.counters.serve(task.tenant, 1)
            for job, n in chunks:
                self.counters.serve(job.tenant, n)
        self._picked = (len(decode), sum(n for _, n in chunks))
        self._background_tokens = sum(n for job, n in chunks if job.lane is not Lane.INTERACTIVE)
        self._streams = streams
        return Iteration(decode, chunks)

    def ran(self, seconds: float) -> None:
        """The last iteration picked took `seconds` (the pacing's account of background prompt time)."""
        if self.pacing is not None:
            rows, tokens = self._picked
            self.pacing.ran(
                seconds,
                rows=rows,
                tokens=tokens,
                background_tokens=self._background_tokens,
                streams=self._streams,
            )

    def rows(self) -> list[D]:
        """The decoding rows with a place in this iteration: up to the cap, lane by lane, each lane's places shared
        between its tenants (weighted max-min, sticky); within a tenant, rows already in the batch first, then
        rows that ran before, then by rank and arrival. Kept in the order they came."""
        self.cap = (
            self.pacing.rows_cap(self.max_batch_size) if self.pacing is not None else self.max_batch_size
        )
        chosen: set[D] = set()
        for lane in sorted({t.lane for t in self.decoding}):
            places = self.cap - len(chosen)
            if places <= 0:
                break
            tasks = [t for t in self.decoding if t.lane == lane]
            demand = Counter(t.tenant for t in tasks)
            held = Counter(t.tenant for t in tasks if t in self.in_batch)
            shares = max_min_shares(demand, places, weight=self.weight, held=held, counters=self.counters.of)
            for tenant, n in shares.items():
                mine = [t for t in tasks if t.tenant == tenant]
                mine.sort(key=lambda t: (t not in self.in_batch, not t.produced, t.rank, t.arrival))
                chosen.update(mine[:n])
        self.in_batch = chosen
        return [t for t in self.decoding if t in chosen]

    def segments(self, rows: int, streams: bool) -> list[tuple[I, int]]:
        """Prompt segments beside `rows` decoding rows (`streams`: interactive ones among them), one per job at
        most, lane by lane, the least served tenant first, within the token budget."""
        limit = self.max_batch_tokens - rows
        pacing = self.pacing
        budget = pacing.chunk_tokens(rows, limit) if pacing is not None else limit
        background = pacing.background_allowed(streams) if pacing is not None else True
        counter, weight = self.counters.of, self.weight
        owed = self.owed_rows()
        held = Counter(t.tenant for t in self.in_batch)
        # Counters tie when a tenant joins (at the smallest of those waiting): then the one with the fewest rows
        # for its weight goes first. Stable: round robin among equals.
        order = sorted(
            self.ingesting,
            key=lambda j: (
                j.lane,
                (j.lane, j.tenant) not in owed,
                counter(j.tenant),
                held[j.tenant] / max(weight(j.tenant), 1e-9),
                j.rank,
            ),
        )
        # A newcomer (a tenant owed rows and holding none: a lone client beside a crowd) has its prompt segment fed
        # whole rather than cut to what the target leaves beside the others' rows (a few tokens an iteration on a
        # slow machine: its first token waited for many iterations). The tokens over the budget are lent by the
        # streams beside it (they lose the same time, at once rather than spread) and repaid from the budgets of
        # the next iterations before another newcomer borrows: prompts take no more time than the target leaves.
        lent, self._lent = self._lent, max(0, self._lent - budget)
        chunks: list[tuple[I, int]] = []
        for job in order:
            if len(chunks) >= self.max_batch_size:
                break
            if job.lane is not Lane.INTERACTIVE and not background:
                continue
            size = min(self.segment_len, job.pending, job.chunk_limit)
            if size > budget:
                if chunks:
                    break
                # Paced: the first segment is cut to the budget, unless it is a newcomer's, or what it would
                # leave is less than min_chunk (a whole iteration more for a few tokens: a prompt's first
                # token waits for it, and the rows beside it lose less to those tokens now than to one more
                # iteration of them later).
                newcomer = not lent and not held[job.tenant] and (job.lane, job.tenant) in owed
                whole = newcomer or size - budget < (pacing.min_chunk if pacing is not None else 0)
                if pacing is not None and (not whole or size > limit):
                    size = max(1, budget)
                elif newcomer:
                    self._lent += size - max(0, budget)
            chunks.append((job, size))
            budget -= size
            if budget <= 0:
                break
        if chunks:
            fed = {id(job) for job, _ in chunks}
            self.ingesting = deque(
                [j for j in self.ingesting if id(j) not in fed] + [j for j in self.ingesting if id(j) in fed]
            )
        return chunks

    def owed_rows(self) -> set[tuple[Lane, str]]:
        """The (lane, tenant)s holding fewer rows of the batch than their fair share of the lane's places, counting
        the rows their prompts open once fed: their prompts go first, whatever their counters (a lone client's
        prompt is not fed after the crowd's, and the row it is owed waits for nothing but its prompt)."""
        owed: set[tuple[Lane, str]] = set()
        places = self.cap
        for lane in sorted({t.lane for t in self.decoding} | {j.lane for j in self.ingesting}):
            demand = Counter(t.tenant for t in self.decoding if t.lane == lane)
            for job in self.ingesting:
                if job.lane == lane:
                    demand[job.tenant] += job.rows_after
            held = Counter(t.tenant for t in self.in_batch if t.lane == lane)
            shares = max_min_shares(demand, places, weight=self.weight, held=held, counters=self.counters.of)
            owed.update((lane, tenant) for tenant, share in shares.items() if held[tenant] < share)
            places -= sum(shares.values())
            if places <= 0:
                break
        return owed

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
        """The job preempted: of the lowest lane (batch, then flex), the one that arrived last."""
        tasks: list[D | I] = [*self.ingesting, *self.decoding]
        return max(tasks, key=lambda t: (t.lane, t.arrival)) if tasks else None
