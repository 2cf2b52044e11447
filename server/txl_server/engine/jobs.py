"""Work handed to the device worker, and the events it sends back.

A job is created on the event loop, executed on the worker thread, and reports through an asyncio queue that
the worker fills with `loop.call_soon_threadsafe`. Cancelling sets a flag the worker reads between iterations.
A job carries the class of the request that makes it (`klass`, admission.classes: its tenant, tier and lane), by
which the worker admits and schedules it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from txl.sampling import SamplingParams

from ..admission.classes import RequestClass
from ..telemetry.spans import job_spans
from .job_timing import JobTiming
from .rows import TopLogprobs
from .state import ModelState
from .wakeup import wake


@dataclass(frozen=True)
class TokenEvent:
    id: int
    text: str
    logprob: float
    top: TopLogprobs | None = None


@dataclass(frozen=True)
class ProgressEvent:
    done: int
    total: int


@dataclass(frozen=True)
class PromptFed:
    """A generation's prompt is fed (a GenerateJob with `report_prompt_state`): the state decoding starts from,
    held for the event's taker (who releases it)."""

    state: ModelState


@dataclass(frozen=True)
class Boundary:
    """The state an AdvanceJob reached at a multiple of its `boundaries` (positions fed), and the log-probs of
    the tokens it fed since the previous one (float32, on the host; NaN for a first token nothing predicts)."""

    state: ModelState
    logprobs: list[float]


@dataclass(frozen=True)
class AdvanceResult:
    state: ModelState
    tokens: int
    logprob: float  # summed over the tokens that had a prediction
    token_logprobs: list[float] | None  # NaN for a first token that nothing predicts
    token_top: list[TopLogprobs | None] | None = None
    boundaries: list[Boundary] = field(default_factory=list)  # with AdvanceJob.boundaries: in order


@dataclass(frozen=True)
class GenerateResult:
    state: ModelState
    text: str
    finish_reason: str  # "length" | "stop"
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int]
    token_logprobs: list[float]
    prompt_logprobs: list[float] | None = None
    prompt_top: list[TopLogprobs | None] | None = None


@dataclass(frozen=True)
class DoneEvent:
    result: Any  # AdvanceResult | GenerateResult, or a CallJob's return value


@dataclass(frozen=True)
class ErrorEvent:
    error: BaseException


Event = TokenEvent | ProgressEvent | PromptFed | DoneEvent | ErrorEvent


def release_result(result: object) -> None:
    """Gives back the states a job's result holds (a result nobody takes: its requester went away)."""
    if isinstance(result, AdvanceResult):
        result.state.release()
        for boundary in result.boundaries:
            boundary.state.release()
    elif isinstance(result, GenerateResult | ModelState):
        (result if isinstance(result, ModelState) else result.state).release()


def release_event(event: Event) -> None:
    """Gives back the states an event holds (an event nobody takes)."""
    if isinstance(event, DoneEvent):
        release_result(event.result)
    elif isinstance(event, PromptFed):
        event.state.release()


class Outbox:
    """Events the worker thread holds back until it next waits (`flush`), then sends to their loops in one
    wake-up each.

    Why: torch's operations and the C kernels release the GIL while they compute, but the worker's Python
    between them (bookkeeping a step's tokens, sampling and planning the next) holds it. An event sent at once
    wakes the loop while the worker is still in that Python, and the two take turns on the GIL: the stream's own
    handling (formatting, the socket write) then adds to every step. Flushed when the next step's layers start
    (the worker sets `flush` as its runner's `before_layers`: the sampling and planning done, right before the
    native calls), the loop does that work while the worker's thread is in native code, off the GIL. A token is
    held back for the next step's preparation only, a fraction of a step; order is kept (one list, flushed
    whole).
    """

    _local = threading.local()
    LAG_SMOOTHING = 0.1  # each delivery's weight in `lag`

    def __init__(self) -> None:
        self._held: list[tuple[Job, Event]] = []
        # Seconds from a flush to its delivery on the event loop (a running mean): how far behind the loop is
        # with writing what the steps produce, which the batch's pacing counts in the time between tokens.
        self.lag = 0.0
        # Called on the event loop with the class of a request whose first token it delivers (admission's check).
        self.on_first_token: Callable[[RequestClass], None] | None = None

    @classmethod
    def current(cls) -> Outbox | None:
        """The outbox of this thread, if it holds events back (`holding`)."""
        return getattr(cls._local, "outbox", None)

    @contextlib.contextmanager
    def holding(self) -> Iterator[Outbox]:
        """Events emitted on this thread within are held here (flushed at the end whatever happens)."""
        self._local.outbox = self
        try:
            yield self
        finally:
            self._local.outbox = None
            self.flush()

    def put(self, job: Job, event: Event) -> None:
        self._held.append((job, event))

    def flush(self) -> None:
        if not self._held:
            return
        held, self._held = self._held, []
        loops: dict[asyncio.AbstractEventLoop, list[tuple[Job, Event]]] = {}
        for job, event in held:
            loops.setdefault(job._loop, []).append((job, event))
        flushed = time.monotonic()
        for loop, events in loops.items():
            with contextlib.suppress(RuntimeError):  # a loop that closed: its jobs have no reader left
                wake(
                    loop, self._deliver, events, flushed
                )  # keeping the GIL: the worker goes on into its step

    def _deliver(self, events: list[tuple[Job, Event]], flushed: float) -> None:
        now = time.monotonic()
        self.lag += self.LAG_SMOOTHING * (now - flushed - self.lag)
        for job, event in events:
            if job.abandoned:  # nobody reads its events: a result's states go back now
                release_event(event)
                continue
            klass = job.klass
            if klass is not None and klass.first_token_at is None and isinstance(event, TokenEvent):
                klass.first_token_at = now
                if self.on_first_token is not None:
                    self.on_first_token(klass)
            job._events.put_nowait(event)


class Job:
    """Base: an event channel back to the loop that submitted it, and a cancellation flag."""

    klass: RequestClass | None = None  # its request's class (None: the server's own work)

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = False
        self.timing = JobTiming()  # for the request's trace
        self.submitted_at = time.monotonic()  # set again when it is handed to the worker
        self.served_at: float | None = None  # when an iteration first served it (its time in queue ends)
        self.stop_reason: Exception | None = None  # why it was cancelled, if not for its client leaving
        self.abandoned = False  # its requester stopped reading its events (a result that comes is released)
        # Sent to its client so far, which a preempted job's next run does not send again (engine.preemption).
        self.tokens_sent = 0
        self.progress_sent = 0

    def cancel(self, reason: Exception | None = None) -> None:
        """Leave the worker at its next iteration; nothing the job computed is kept. The job ends with `reason`
        as its error (default: its client went away)."""
        if not self.cancelled:
            self.stop_reason = reason
        self.cancelled = True

    def emit(self, event: Event) -> None:
        """Called from the worker thread (held back while its Outbox is `holding`). A terminal event ends the
        job: what it held of its input goes back."""
        if isinstance(event, DoneEvent | ErrorEvent):
            self.release_input()
        outbox = Outbox.current()
        if outbox is not None:
            outbox.put(self, event)
        else:
            self._loop.call_soon_threadsafe(self._put, event)

    def _put(self, event: Event) -> None:
        if self.abandoned:
            release_event(event)
            return
        self._events.put_nowait(event)

    def release_input(self) -> None:
        """The job's hold on its input state goes (it ended, or never reached the worker); idempotent."""

    def abandon(self) -> None:
        """Its requester reads no more events (on the job's loop): it is cancelled, and the states of a result
        that came, or comes, go back to the pool."""
        self.cancel()
        self.abandoned = True
        while not self._events.empty():
            release_event(self._events.get_nowait())

    async def events(self) -> AsyncIterator[Event]:
        """Events until (and including) the terminal one."""
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, DoneEvent | ErrorEvent):
                return

    async def result(self) -> Any:
        async for event in self.events():
            if isinstance(event, ErrorEvent):
                raise event.error
            if isinstance(event, DoneEvent):
                return event.result
        raise RuntimeError("job ended without a result")  # pragma: no cover


@dataclass(eq=False)
class AdvanceJob(Job):
    """Feed `tokens` after `state`: appends, prompts, scoring. Reports progress after each segment."""

    state: ModelState
    tokens: list[int]
    token_logprobs: bool = False
    top_logprobs: int = 0  # with token_logprobs: also the k most likely tokens at each position
    report_progress: bool = False
    # > 0: segments end at every multiple of this many positions fed, and the states there are kept
    # (the prefix cache: sessions/prefix_cache.py)
    boundaries: int = 0
    # The states of at most this many boundaries (the first) are kept: a long document's later ones would only be
    # dropped by the cache after the job, having held their memory until its end.
    keep_boundaries: int | None = None
    klass: RequestClass | None = None

    def __post_init__(self) -> None:
        super().__init__()
        self.state = self.state.retain()  # its own hold on its input, for its whole run (re-queued: from it)

    def release_input(self) -> None:
        self.state.release()


@dataclass(eq=False)
class GenerateJob(Job):
    """Feed `prompt` after `state`, then sample up to `max_tokens`, streaming a TokenEvent per token."""

    state: ModelState
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    prompt_logprobs: bool = False  # log p of each prompt token (the first, if nothing precedes it, is NaN)
    top_logprobs: int = (
        0  # the k most likely tokens at each prompt (if prompt_logprobs) and generated position
    )
    klass: RequestClass | None = None
    report_progress: bool = False  # a ProgressEvent after each prompt segment fed, before the first token
    report_prompt_state: bool = (
        False  # a PromptFed once the prompt is fed (its blocks can be stored meanwhile)
    )

    def __post_init__(self) -> None:
        super().__init__()
        self.state = self.state.retain()  # its own hold on its input, for its whole run (re-queued: from it)

    def release_input(self) -> None:
        self.state.release()


class CallJob(Job):
    """A function to run on the worker thread between iterations (writes to the device's memory pool)."""

    def __init__(self, function: Callable[[], Any]) -> None:
        super().__init__()
        self.function = function


class CancelledByClient(Exception):
    """The job was cancelled (its client went away); nothing it computed was kept."""


class Submitter(Protocol):
    """What runs jobs (the device worker): it takes a job, and the job reports through its events."""

    def submit(self, job: Job) -> None: ...


async def run_job(worker: Submitter, job: Job) -> AsyncGenerator[Any, None]:
    """Submits `job`; yields its token/progress events, then its result. Cancels it if abandoned early."""
    worker.submit(job)
    finished = False
    try:
        async for event in job.events():
            if isinstance(event, ErrorEvent):
                finished = True
                error = event.error
                del (
                    event
                )  # else its traceback, through this frame, keeps the event and the error alive in a cycle
                raise error
            if isinstance(event, DoneEvent):
                finished = True
                yield event.result
                return
            yield event
    finally:
        if not finished:
            job.abandon()
        job_spans(job, finished=finished)


async def job_result(worker: Submitter, job: Job, on_event: Callable[[Event], None] | None = None) -> Any:
    """Runs `job` to its result, passing its intermediate events to `on_event`; cancelled if abandoned."""
    async with contextlib.aclosing(run_job(worker, job)) as events:
        async for item in events:
            if not isinstance(item, TokenEvent | ProgressEvent | PromptFed):
                return item
            if on_event is not None:
                on_event(item)
    raise RuntimeError("job ended without a result")  # pragma: no cover
