"""The scheduler on its own (engine.scheduler), with plain fakes for the jobs and the pool: what each iteration
runs under the token budget and the batch size, what fits the pool's free blocks, and which job is preempted."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from txl_server.engine import scheduler as scheduler_module
from txl_server.engine.scheduler import Scheduler

_arrivals = itertools.count()


@dataclass(eq=False)
class Decode:
    blocks: int = 0  # fresh blocks its next token takes
    cancelled: bool = False
    arrival: int = field(default_factory=lambda: next(_arrivals))

    def new_blocks(self, tokens: int, claimed: set[int]) -> int:
        return self.blocks


@dataclass(eq=False)
class Ingest:
    pending: int
    limit: int | None = None  # the most its next segment may feed (None: all it has)
    blocks: int = 0  # fresh blocks its next segment takes
    cancelled: bool = False
    arrival: int = field(default_factory=lambda: next(_arrivals))

    @property
    def chunk_limit(self) -> int:
        return self.pending if self.limit is None else self.limit

    def new_blocks(self, tokens: int, claimed: set[int]) -> int:
        return self.blocks


@dataclass
class Pool:
    available_blocks: int = 1000
    growable: bool = False


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    *,
    segment_len: int = 8,
    max_batch_size: int = 4,
    max_batch_tokens: int = 16,
    pool: Pool | None = None,
    clock: Clock | None = None,
) -> Scheduler[Decode, Ingest]:
    return Scheduler(
        segment_len=segment_len,
        max_batch_size=max_batch_size,
        max_batch_tokens=max_batch_tokens,
        pool=pool or Pool(),
        clock=clock or Clock(),
    )


def test_every_decoding_row_runs_with_segments_of_the_ingesting_jobs_within_the_token_budget():
    s = make(segment_len=8, max_batch_size=4, max_batch_tokens=16)
    decoding = [Decode(), Decode()]
    ingesting = [Ingest(20), Ingest(20), Ingest(20)]
    for task in decoding:
        s.add_decoding(task)
    for task in ingesting:
        s.add_ingesting(task)
    it = s.schedule().iteration
    assert it.decode == decoding
    # 16 tokens: the 2 decoding rows first, then one segment of 8; the next would overflow the budget.
    assert it.chunks == [(ingesting[0], 8)] and it.tokens == 10


def test_decoding_rows_come_first_and_a_segment_runs_even_when_they_use_the_whole_budget():
    s = make(segment_len=8, max_batch_size=4, max_batch_tokens=4)
    decoding = [Decode() for _ in range(4)]
    ingest = Ingest(30)
    for task in decoding:
        s.add_decoding(task)
    s.add_ingesting(ingest)
    it = s.schedule().iteration
    assert it.decode == decoding and it.chunks == [(ingest, 8)]  # ingestion always progresses


def test_decoding_rows_beyond_the_batch_size_take_turns():
    s = make(max_batch_size=2)
    decoding = [Decode() for _ in range(5)]
    for task in decoding:
        s.add_decoding(task)
    runs = [s.schedule().iteration.decode for _ in range(3)]
    assert runs == [decoding[0:2], decoding[2:4], [decoding[4], decoding[0]]]


def test_a_job_feeds_one_segment_per_iteration_and_segments_end_at_its_limit():
    s = make(segment_len=8, max_batch_size=4, max_batch_tokens=64)
    short, bounded, long = Ingest(3), Ingest(30, limit=5), Ingest(30)
    for task in (short, bounded, long):
        s.add_ingesting(task)
    it = s.schedule().iteration
    assert it.chunks == [(short, 3), (bounded, 5), (long, 8)]  # each job once, however much budget is left


def test_no_more_segments_than_the_batch_size_and_the_queue_turns_round_robin():
    s = make(segment_len=8, max_batch_size=2, max_batch_tokens=64)
    jobs = [Ingest(30) for _ in range(3)]
    for task in jobs:
        s.add_ingesting(task)
    first = [job for job, _ in s.schedule().iteration.chunks]
    second = [job for job, _ in s.schedule().iteration.chunks]
    assert first == jobs[:2] and second == [jobs[2], jobs[0]]


def test_a_pool_that_may_grow_runs_everything():
    s = make(pool=Pool(available_blocks=0, growable=True))
    task, ingest = Decode(blocks=3), Ingest(8, blocks=5)
    s.add_decoding(task)
    s.add_ingesting(ingest)
    plan = s.schedule()
    assert plan.iteration.decode == [task] and plan.iteration.chunks == [(ingest, 8)]
    assert plan.lacking == 0 and plan.preempt is None


def test_rows_whose_blocks_the_pool_lacks_wait_and_their_need_is_reported():
    pool = Pool(available_blocks=3)
    s = make(pool=pool)
    fits, too_big, after = Decode(blocks=2), Decode(blocks=2), Decode(blocks=1)
    ingest = Ingest(8, blocks=4)
    for task in (fits, too_big, after):
        s.add_decoding(task)
    s.add_ingesting(ingest)
    plan = s.schedule()
    # In order, each row takes what is still free: 2 of 3, then 2 do not fit, then 1 does; the segment's 4 not.
    assert plan.iteration.decode == [fits, after] and plan.iteration.chunks == []
    assert plan.lacking == 2 + 4 and plan.preempt is None
    assert s.active == 4  # what waits stays queued


def test_when_nothing_fits_for_long_enough_the_youngest_job_is_preempted(monkeypatch):
    monkeypatch.setattr(scheduler_module.gc, "collect", lambda: 0)
    pool, clock = Pool(available_blocks=0), Clock()
    s = make(pool=pool, clock=clock)
    older, younger = Decode(blocks=1), Ingest(8, blocks=1)
    s.add_decoding(older)
    s.add_ingesting(younger)
    assert s.schedule().preempt is None  # starved from now
    clock.now += scheduler_module.PREEMPT_AFTER_SECONDS / 2
    assert s.schedule().preempt is None
    clock.now += scheduler_module.PREEMPT_AFTER_SECONDS / 2
    plan = s.schedule()
    assert not plan.iteration and plan.preempt is younger and plan.lacking == 2
    assert s.active == 2  # still queued: the worker ends it (and so takes it out)
    s.remove_ingesting(younger)
    assert s.schedule().preempt is None  # the wait starts again


def test_a_step_that_fits_ends_the_wait_for_blocks(monkeypatch):
    monkeypatch.setattr(scheduler_module.gc, "collect", lambda: 0)
    pool, clock = Pool(available_blocks=0), Clock()
    s = make(pool=pool, clock=clock)
    s.add_decoding(Decode(blocks=1))
    s.schedule()
    clock.now += scheduler_module.PREEMPT_AFTER_SECONDS - 0.1
    pool.available_blocks = 1
    assert s.schedule().iteration  # it fits: no longer starved
    pool.available_blocks = 0
    clock.now += 0.2
    assert s.schedule().preempt is None  # a new wait, not the old one's


def test_blocks_held_only_by_reference_cycles_are_collected_before_rows_are_left_out(monkeypatch):
    pool, clock = Pool(available_blocks=0), Clock()
    collections: list[float] = []

    def collect() -> int:
        collections.append(clock.now)
        pool.available_blocks = 1  # the collector freed a block
        return 0

    monkeypatch.setattr(scheduler_module.gc, "collect", collect)
    s = make(pool=pool, clock=clock)
    task = Decode(blocks=1)
    s.add_decoding(task)
    plan = s.schedule()
    assert plan.iteration.decode == [task] and plan.lacking == 0 and collections == [clock.now]
    pool.available_blocks = 0
    clock.now += scheduler_module.COLLECT_INTERVAL_SECONDS / 2
    s.schedule()
    assert len(collections) == 1  # at most once per interval


def test_cancelled_jobs_are_dropped_from_both_queues():
    s = make()
    keep, gone = Decode(), Decode(cancelled=True)
    feeding, stopped = Ingest(8), Ingest(8, cancelled=True)
    for task in (keep, gone):
        s.add_decoding(task)
    for ingest in (feeding, stopped):
        s.add_ingesting(ingest)
    assert s.drop_cancelled() == [stopped, gone]
    assert s.decoding == [keep] and list(s.ingesting) == [feeding] and s.active == 2
    assert s.drop_cancelled() == []


def test_the_limits_must_be_positive():
    with pytest.raises(ValueError, match=">= 1"):
        make(max_batch_tokens=0)
