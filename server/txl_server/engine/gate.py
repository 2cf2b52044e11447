"""Admission at the worker's door: a request's first job is admitted, or refused at once (`Overloaded`, with the
policy's reason and Retry-After), before it takes anything; the jobs it makes after continue admitted work.

The gate describes what the worker holds as values (`admission.estimate.Backlog`: each job's lane, tenant, rank,
tokens to feed and to decode, whether its row is in the batch; the batch's cap; the measured step times) and asks
the policy (`admission.policy`). It is read on the event loop's thread, when a job is submitted, from the
scheduler's queues as they stand (copied whole, under the GIL; a job the worker has taken from its inbox but not
yet queued is counted from the worker's `admitting` list). It also keeps what the metrics show of the queues:
their depth and each job's time in them, by class.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

from ..admission.classes import CLASSES, DEFAULT, Lane, RequestClass
from ..admission.estimate import Backlog, Work
from ..admission.pacing import Pacing
from ..admission.policy import AdmissionPolicy, Refuse
from ..admission.targets import LatencyTargets
from ..errors import Overloaded
from .jobs import AdvanceJob, GenerateJob, Job, Outbox
from .scheduler import Iteration, Scheduler
from .step_times import Measured, StepTimes
from .tasks import DecodeTask, IngestTask

DRAIN_WINDOW_SECONDS = 5.0  # the queue's drain rate is measured over about this long
FIRST_INTERVAL_SECONDS = 0.1  # between two requests ending, before any did
MAX_INTERVAL_SECONDS = 5.0
# Refusal reasons of the worker itself (the error's `code`; docs/api.md lists them).
QUEUE_FULL = "queue_full"  # it holds TXL_MAX_QUEUED_JOBS jobs
DEVICE_MEMORY_FULL = "device_memory_full"  # the device's memory pool is full


class GateObserver:
    """Hooks for metrics; the defaults do nothing."""

    def on_admission(self, klass: str, refused: str | None) -> None:
        """A request of class `klass` was admitted (`refused` None) or refused for that reason."""

    def on_queued(self, depth: dict[str, int]) -> None:
        """Jobs waiting for their first service, by class."""

    def on_queue_time(self, klass: str, seconds: float) -> None:
        """A job of class `klass` was first served after waiting `seconds`."""

    def on_pacing(self, targets: LatencyTargets, row_cap: int, factor: float) -> None:
        """The targets the worker is paced to, the rows its batch may hold now, and how far off (a factor) the
        estimate of first tokens was lately."""


class Gate:
    def __init__(
        self,
        scheduler: Scheduler[DecodeTask, IngestTask],
        policy: AdmissionPolicy,
        step_times: StepTimes,
        pacing: Pacing,
        outbox: Outbox,
        observer: GateObserver | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.policy = policy
        self.targets = policy.targets
        self.step_times = step_times
        self.pacing = pacing
        self.outbox = outbox
        self.observer = observer or GateObserver()
        self.interval = FIRST_INTERVAL_SECONDS  # seconds between two requests ending, lately
        self._ended = 0.0  # requests that ended, decayed over DRAIN_WINDOW_SECONDS
        self._busy = 0.0  # seconds the worker was busy, decayed alike

    @classmethod
    def paced(
        cls,
        targets: LatencyTargets,
        measured: Measured,
        scheduler: Scheduler[DecodeTask, IngestTask],
        outbox: Outbox,
        observer: GateObserver,
        weight: Callable[[str], float],
    ) -> Gate:
        """The gate of a worker paced to `targets`: its scheduler's batch paced over step times learned from
        `measured` (start-up) and every iteration run, its requests admitted to them."""
        step_times = StepTimes(measured)
        scheduler.pacing = pacing = Pacing(targets, step_times, min_chunk=max(8, scheduler.segment_len // 8))
        policy = AdmissionPolicy(targets, weight=weight)
        observer.on_pacing(targets, scheduler.cap, policy.factor)
        gate = cls(scheduler, policy, step_times, pacing, outbox, observer)
        outbox.on_first_token = gate.first_token
        return gate

    # ------------------------------------------------------------------ event loop side

    def check(self, job: AdvanceJob | GenerateJob, queued: Sequence[Job]) -> None:
        """Admits `job`'s request, or raises Overloaded (a job of admitted work, or of the server's own, passes)."""
        klass = job.klass
        if klass is None or klass.admitted:
            return
        decision = self.policy.decide(self.backlog(queued), self.demand(job), request_key(job))
        if isinstance(decision, Refuse):
            self.observer.on_admission(klass.name, decision.reason)
            raise Overloaded(decision.message, retry_after=decision.retry_after, code=decision.reason)
        klass.admitted = True
        if decision.wait is not None:
            klass.expected_at = time.monotonic() + decision.wait.first_token
        self.observer.on_admission(klass.name, None)

    def first_token(self, klass: RequestClass) -> None:
        """An admitted request's first token was delivered (`Outbox`): the estimate learns how far off it was."""
        if klass.expected_at is not None and klass.first_token_at is not None:
            expected = klass.expected_at - klass.created_at
            self.policy.learn(expected, klass.first_token_at - klass.created_at)

    def backlog(self, queued: Sequence[Job]) -> Backlog:
        s = self.scheduler
        in_batch = set(s.in_batch)
        work = [_decoding(t, t in in_batch) for t in list(s.decoding)]
        work += [_ingesting(t) for t in list(s.ingesting)]
        work += [_queued(j) for j in queued if isinstance(j, AdvanceJob | GenerateJob)]
        # The prompts ahead are fed beside the rows the batch will hold by then: those decoding now, and those
        # of the work ahead as its prompts end (a burst's later prompts are fed beside its earlier ones' rows).
        coming = sum(w.rows for w in work if not w.running)
        timing, rows = self.step_times, min(s.cap, len(in_batch) + coming)
        chunk = self.pacing.chunk_tokens(rows, max(1, s.max_batch_tokens - rows))
        token_seconds = timing.per_token() + timing.iteration(rows, 0) / max(1, chunk)
        feeding = any(w.feed for w in work)
        at_cap = self.pacing.chunk_tokens(s.cap, max(1, s.max_batch_tokens - s.cap)) if feeding else 0
        step = timing.iteration(s.cap, at_cap)
        counters = {w.tenant: s.counters.of(w.tenant) for w in work}
        return Backlog(
            tuple(work),
            s.cap,
            step,
            token_seconds,
            lag=self.outbox.lag,
            interval=self.interval,
            counters=counters,
        )

    def demand(self, job: AdvanceJob | GenerateJob) -> Work:
        """What the new job's request waits for: its prompt and a row, or (if it only feeds) its first segment."""
        work = _queued(job)
        if not work.rows:
            return Work(work.lane, work.tenant, work.rank, min(work.feed, self.scheduler.segment_len), 0, 0)
        return work

    # ------------------------------------------------------------------ worker side

    def ran(self, iteration: Iteration[DecodeTask, IngestTask], seconds: float) -> None:
        """What an iteration's time teaches the step times and the pacing."""
        self.step_times.observe(len(iteration.decode), iteration.tokens - len(iteration.decode), seconds)
        self.scheduler.ran(seconds)
        self.pacing.lag = self.outbox.lag
        self.observer.on_pacing(self.targets, self.scheduler.cap, self.policy.factor)

    def ended(self, jobs: int, rows: int, seconds: float) -> None:
        """An iteration of `seconds` in which `jobs` jobs ended, `rows` of them decoding rows. The queue's drain
        rate is what ended over the time the worker was busy, both decaying over DRAIN_WINDOW_SECONDS; what a
        request waits for is a row where rows decode (a request that decodes makes two jobs: its prompt's and
        its row's), else a job."""
        keep = math.exp(-seconds / DRAIN_WINDOW_SECONDS)
        self._ended = self._ended * keep + (rows if self.scheduler.decoding or rows else jobs)
        self._busy = self._busy * keep + seconds
        if self._ended > 0:
            self.interval = min(MAX_INTERVAL_SECONDS, self._busy / self._ended)

    def served(self, iteration: Iteration[DecodeTask, IngestTask], inbox: Sequence[Job]) -> None:
        """After an iteration is picked: the time in queue of the jobs it serves first, and the queues' depth."""
        now = time.monotonic()
        first: list[DecodeTask | IngestTask] = [t for t in iteration.decode if t.job.served_at is None]
        first += [t for t, _ in iteration.chunks if t.job.served_at is None]
        for task in first:
            task.job.served_at = now
            self.observer.on_queue_time(task.class_name, now - task.job.submitted_at)
        waiting: Counter[str] = Counter({name: 0 for name in CLASSES})
        for waiting_task in [*self.scheduler.decoding, *self.scheduler.ingesting]:
            if waiting_task.job.served_at is None:
                waiting[waiting_task.class_name] += 1
        for job in inbox:
            waiting[job.klass.name if job.klass is not None else DEFAULT] += 1
        self.observer.on_queued(dict(waiting))


def _decoding(task: DecodeTask, running: bool) -> Work:
    return Work(task.lane, task.tenant, task.rank, 0, task.remaining, 1, running)


def _ingesting(task: IngestTask) -> Work:
    decode, rows = _then(task.job)
    return Work(task.lane, task.tenant, task.rank, task.pending, decode, rows)


def _queued(job: AdvanceJob | GenerateJob) -> Work:
    klass = job.klass
    lane = klass.lane if klass is not None else Lane.INTERACTIVE
    tenant = klass.tenant if klass is not None else ""
    rank = klass.rank if klass is not None else 1
    feed = len(job.prompt) if isinstance(job, GenerateJob) else len(job.tokens)
    decode, rows = _then(job)
    return Work(lane, tenant, rank, feed, decode, rows)


def request_key(job: AdvanceJob | GenerateJob) -> Hashable | None:
    """The request whose first job this is, as its retry makes it again (the same request resent: the same
    tenant and class, input and tokens to decode), by which a promise of a retry is kept for it
    (admission.retry); None for batch work, which is never refused for its latency."""
    klass = job.klass
    if klass is None or klass.lane is Lane.BATCH:
        return None
    tokens = job.prompt if isinstance(job, GenerateJob) else job.tokens
    decode = _then(job)
    return (klass.tenant, klass.tier, type(job).__name__, decode, len(tokens), hash(tuple(tokens)))


def _then(job: AdvanceJob | GenerateJob) -> tuple[int, int]:
    """(tokens, rows) the job decodes once its input is fed."""
    if isinstance(job, GenerateJob):
        return job.max_tokens, 1
    klass = job.klass
    if klass is not None and klass.decode_rows:
        return klass.decode_tokens, klass.decode_rows
    return 0, 0
