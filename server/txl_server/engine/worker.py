"""The device worker: one thread that owns the model and the memory pool and runs every forward pass.

Each iteration it (1) turns new jobs into tasks (`engine.tasks`) and drops cancelled ones, (2) takes the work the
scheduler decides (`engine.scheduler`: every decoding row and segments of ingesting jobs under a token budget, as
far as the pool has blocks for them; the job to preempt when nothing fits), and (3) runs it as one forward
(`ModelRunner`): decoding rows sample their token on the device and feed it beside the segments; with graphs it
may send the next decoding iteration before reading this one's tokens (overlapped decoding). What happened goes
to the jobs through `engine.outputs`. Handlers never touch the model: they submit jobs and await their events.
Work that writes the device's memory pool from outside a step (restoring a session to the device) runs here too,
between iterations (`call`).

Paced (`pace`, at start-up), the worker admits a request at its door or refuses it at once (`engine.gate`), and
each iteration's time teaches the step-time model (`engine.step_times`) that the pacing and the estimate read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from txl import BlockPool, PoolExhausted, TransfoXLLMHeadModel
from txl.kernels import REFERENCE, DecodePath
from txl.tokenizers import Tokenizer
from txl.window import WindowRule

from ..admission.classes import DEFAULT
from ..admission.fair_share import even
from ..admission.targets import LatencyTargets
from ..errors import Overloaded, Unavailable
from . import device_failure, preemption
from .device_failure import first_line, is_device_error
from .gate import QUEUE_FULL, Gate, GateObserver
from .jobs import AdvanceJob, CallJob, DoneEvent, ErrorEvent, GenerateJob, Job, Outbox
from .launched import Pending
from .outputs import Outputs
from .rows import ChunkRow, DecodeRow
from .runner import ModelRunner
from .scheduler import Iteration, Scheduler
from .state import ModelState
from .step_times import Measured
from .tasks import DecodeTask, IngestTask

log = logging.getLogger(__name__)

# How long the loop waits between looks while nothing can run for lack of blocks (others' commits and
# evictions free them).
STARVED_WAIT_SECONDS = 0.01


class WorkerObserver(GateObserver):
    """Hooks for metrics (and the gate's); the defaults do nothing."""

    def on_prefill(self, tokens: int, seconds: float) -> None: ...

    def on_decode(self, batch_size: int, seconds: float) -> None: ...

    def on_queue(self, queued: int, active: int) -> None: ...

    def on_cancel(self) -> None: ...


class Worker:
    def __init__(
        self,
        model: TransfoXLLMHeadModel,
        tokenizer: Tokenizer,
        *,
        segment_len: int,
        max_batch_size: int,
        max_queued: int,
        max_batch_tokens: int | None = None,
        pool: BlockPool | None = None,
        path: DecodePath = REFERENCE,
        max_mem_len: int | None = None,
        observer: WorkerObserver | None = None,
        overlap: bool = False,
        weight: Callable[[str], float] = even,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.segment_len = segment_len
        self.max_batch_size = max_batch_size
        self.max_queued = max_queued
        self.pool = pool if pool is not None else model.empty_memory().pool
        self.scheduler: Scheduler[DecodeTask, IngestTask] = Scheduler(
            segment_len=segment_len,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens or max(2 * segment_len, max_batch_size + segment_len),
            pool=self.pool,
            weight=weight,
        )
        self.weight = weight
        self.outputs = Outputs(self.scheduler, tokenizer)
        # Every session's windows sit on the grid the model was trained with: a session's state is then a
        # function of its tokens, however they arrive (txl.window).
        self.grid = model.config.segment_len
        largest = WindowRule(
            max_mem_len if max_mem_len is not None else model.config.mem_len,
            model.config.same_length,
            self.grid,
        )
        self.max_positions = largest.max_positions
        # The positional table sized once for the longest key length any step asks for (a memory at its
        # largest and a whole segment), so that serving never reallocates it.
        model.transformer.reserve_positions(self.max_positions + segment_len)
        # Decoding one step ahead of the device (graphs only: `_launch`); the iteration sent and not yet read.
        self._overlap_wanted = overlap
        self._pending: Pending[DecodeTask] | None = None
        self._thread: threading.Thread | None = None
        self._outbox = Outbox()  # events held back until the worker next computes or waits
        self.runner = ModelRunner(model, self.pool)  # the reference path, until `decode_with` (below)
        self.decode_with(path)
        self.observer = observer or WorkerObserver()
        # Called (on this thread) with the blocks an iteration lacks when a pool that may not grow is full: the
        # session service then moves idle sessions off the device. Work that still cannot run is preempted.
        self.on_pool_pressure: Callable[[int], None] | None = None
        # Set when a step fails with an error of the device after which it no longer works (a CUDA error that
        # poisons the whole context: `device_failure`): the server then reports not ready, so that an
        # orchestrator restarts it.
        self.device_error: str | None = None
        # When the worker last showed progress (time.monotonic()): an iteration ended, it went idle or woke, or
        # work came while it was idle. Work waiting long past it is a stuck worker (`stalled_for`).
        self.progress_at = time.monotonic()
        # Admission and pacing to latency targets (`pace`); None: every job is taken, the batch as large as
        # max_batch_size (tests and the server's checks drive a worker so).
        self.gate: Gate | None = None
        self._cv = threading.Condition()
        self._inbox: list[Job] = []
        self._admitting: list[Job] = []  # taken from the inbox, not yet queued (the gate counts them)
        self._stopping = False

    def decode_with(self, path: DecodePath) -> None:
        """Every step runs on `path` (its kernels, and its graphs where it names them), chosen once, before the
        worker starts: engine.selfcheck chooses and checks it at start-up."""
        if self._thread is not None or self.runner.graphs is not None:
            raise RuntimeError("the decode path is chosen once, before the worker starts")
        self.runner = ModelRunner.serving(
            self.model, self.pool, path, self.max_batch_size, self.max_positions
        )
        self.overlap = self._overlap_wanted and self.runner.graphs is not None
        self.runner.before_layers = self._outbox.flush

    # ------------------------------------------------------------------ control (event loop side)

    def pace(self, targets: LatencyTargets, measured: Measured) -> None:
        """From now on (before `start`): the batch paced to `targets` and requests admitted to them, over step
        times learned from `measured` (start-up) and every iteration run."""
        self.gate = Gate.paced(targets, measured, self.scheduler, self._outbox, self.observer, self.weight)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="txl-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def stopped(self) -> bool:
        """Its thread has ended (or never started): nothing reads or writes the pool any more."""
        return self._thread is None or not self._thread.is_alive()

    def submit(self, job: Job) -> None:
        """Queues `job`; one refused gives back its hold on its input."""
        try:
            self._enqueue(job)
        except BaseException:
            job.release_input()
            raise

    def _enqueue(self, job: Job) -> None:
        with self._cv:
            if self._stopping:
                raise Unavailable("the server is shutting down")
            if not isinstance(job, CallJob):
                if self._load() >= self.max_queued:
                    retry_after = self.gate.interval * self.max_queued if self.gate is not None else 1.0
                    full = "too many requests are in progress; retry shortly"
                    klass = job.klass.name if job.klass is not None else DEFAULT
                    self.observer.on_admission(klass, QUEUE_FULL)
                    raise Overloaded(full, retry_after=retry_after, code=QUEUE_FULL)
                if self.gate is not None and isinstance(job, AdvanceJob | GenerateJob):
                    self.gate.check(job, self._inbox + self._admitting)
                job.submitted_at = time.monotonic()
            if not self._load():  # idle until now: what it waits for starts counting here
                self.progress_at = time.monotonic()
            self._inbox.append(job)
            self._cv.notify()

    async def call(self, function: Callable[[], Any]) -> Any:
        """Runs `function` on the worker thread between iterations (work that writes the device's pool)."""
        job = CallJob(function)
        self.submit(job)
        return await job.result()

    def empty_state(self, mem_len: int) -> ModelState:
        """A state holding nothing, in this worker's pool, its windows on the server's grid."""
        return ModelState.empty(self.model.empty_memory(mem_len=mem_len, pool=self.pool, grid=self.grid))

    @property
    def active_jobs(self) -> int:
        return self.scheduler.active

    @property
    def queued_jobs(self) -> int:
        """Jobs handed to the worker and not yet admitted (read without the lock: a count of that moment)."""
        return len(self._inbox)

    def _load(self) -> int:
        return len(self._inbox) + len(self._admitting) + self.active_jobs

    def stalled_for(self) -> float:
        """Seconds that work has waited with no iteration ending (0 while idle or progressing): a hung kernel or
        a deadlock, which liveness reports (`Runtime.liveness`). Read without the lock (a stuck worker may hold
        it); a job's arrival or end seen a moment late only shifts it by that moment."""
        busy = bool(self._inbox) or self.scheduler.active > 0 or self._pending is not None
        return max(0.0, time.monotonic() - self.progress_at) if busy else 0.0

    @property
    def died(self) -> bool:
        """Its thread ended while not asked to stop (an error escaped the loop): nothing will be served."""
        return self._thread is not None and not self._thread.is_alive() and not self._stopping

    # ------------------------------------------------------------------ loop (worker thread)

    def _run(self) -> None:
        with torch.inference_mode(), self._outbox.holding():
            while self._wait_for_work():
                self._iterate()
            self._finish_pending()
        shutdown = Unavailable("the server is shutting down")
        running: list[IngestTask | DecodeTask] = [*self.scheduler.ingesting, *self.scheduler.decoding]
        for task in running:
            task.release()
        for job in [*(t.job for t in running), *self._inbox]:
            job.emit(ErrorEvent(shutdown))

    def _wait_for_work(self) -> bool:
        with self._cv:
            while not self._stopping and not self._inbox and not self.scheduler.active:
                self._outbox.flush()
                self.progress_at = time.monotonic()
                self._cv.wait()
            self.progress_at = time.monotonic()
            return not self._stopping

    def _iterate(self) -> None:
        """One iteration. Its own frame: nothing of a finished job (whose states hold memory blocks) stays
        referenced while the worker waits for the next."""
        started = time.perf_counter()
        with self._cv:
            new, self._inbox = self._inbox, []
            self._admitting = new
        for job in new:
            self._admit(job)
        with self._cv:
            self._admitting = []
        before, rows_before = self.active_jobs + len(new), self.scheduler.rows_ended
        for task in self.scheduler.drop_cancelled():
            self.observer.on_cancel()
            self.outputs.cancelled(task)
        self.observer.on_queue(len(self._inbox), self.active_jobs)
        iteration = self._schedule()
        if self.gate is not None:
            self.gate.served(iteration, list(self._inbox))
        if iteration:
            self._step(iteration)
            if self.gate is not None:
                self.gate.ran(iteration, time.perf_counter() - started)
        elif self._pending is not None:
            self._finish_pending()
        elif self.scheduler.active:  # waiting for blocks: others' commits and evictions free them
            self._outbox.flush()
            with self._cv:
                self._cv.wait(STARVED_WAIT_SECONDS)
        self.progress_at = time.monotonic()
        self.observer.on_queue(len(self._inbox), self.active_jobs)
        if self.gate is not None:
            ended = before - self.active_jobs
            self.gate.ended(ended, self.scheduler.rows_ended - rows_before, time.perf_counter() - started)

    def _schedule(self) -> Iteration[DecodeTask, IngestTask]:
        """The scheduler's iteration. What it leaves out for lack of blocks asks idle sessions to leave the
        device (`on_pool_pressure`); the job it preempts goes back to the queue, and a job that could never fit
        fails (engine.preemption)."""
        schedule = self.scheduler.schedule()
        if schedule.lacking and self.on_pool_pressure is not None:
            self.on_pool_pressure(schedule.lacking)
        if schedule.preempt is not None:
            preemption.preempt(schedule.preempt, self.scheduler, self.outputs, self.pool)
        return schedule.iteration

    # ------------------------------------------------------------------ admission

    def _admit(self, job: Job) -> None:
        job.timing.admit()
        if isinstance(job, CallJob):
            self._call(job)
            return
        if not isinstance(job, AdvanceJob | GenerateJob):  # pragma: no cover - programming error
            job.emit(ErrorEvent(TypeError(f"unknown job {type(job).__name__}")))
            return
        try:
            state = self._on_pool(job.state)
        except Exception as exc:
            job.emit(ErrorEvent(exc))
            return
        self.outputs.start(job, state)

    def _call(self, job: CallJob) -> None:
        try:
            result = job.function()
        except PoolExhausted as exc:  # restoring a session to a full device: retryable
            log.info("no room on the device: %s", exc)
            if self.on_pool_pressure is not None:
                self.on_pool_pressure(1)
            job.emit(ErrorEvent(preemption.memory_full()))
        except Exception as exc:  # the caller gets the error
            job.emit(ErrorEvent(exc))
        else:
            job.emit(DoneEvent(result))

    def _on_pool(self, state: ModelState) -> ModelState:
        """The state with its memory in this worker's pool, the task's own hold (a state made elsewhere is copied
        in once)."""
        if state.memory.pool is self.pool:
            return state.retain()
        return ModelState(state.memory.to_pool(self.pool), state.last_hidden, state.tail)

    # ------------------------------------------------------------------ one iteration

    def _step(self, iteration: Iteration[DecodeTask, IngestTask]) -> None:
        if self.overlap and iteration.decode and not iteration.chunks and self._launch(iteration.decode):
            return
        if self._pending is not None:  # its tokens first: they may end some of this iteration's tasks
            self._finish_pending()
            decoding = self.scheduler.decoding
            iteration = Iteration([t for t in iteration.decode if t in decoding], iteration.chunks)
            if not iteration:
                return
        started = time.perf_counter()
        decode_rows = [t.next_row() for t in iteration.decode]
        chunk_rows = [t.next_chunk(n) for t, n in iteration.chunks]
        try:
            # The last step's events go out when this one's layers start: the loop handles them while this thread
            # is in native code, off the GIL (handed out before the sampling and planning, the loop's Python ran
            # between their many small operations and held up each one).
            decoded, fed = self.runner.run(decode_rows, chunk_rows)
        except Exception as exc:
            if self._device_failed(exc) or len(decode_rows) + len(chunk_rows) == 1:
                self._failed_step(iteration.decode, [t for t, _ in iteration.chunks], exc)
            else:
                log.warning(
                    "a step of %d rows failed (%s): running them one by one",
                    len(decode_rows) + len(chunk_rows),
                    first_line(exc),
                )
                self._one_by_one(iteration.decode, decode_rows, iteration.chunks, chunk_rows)
            return
        seconds = time.perf_counter() - started
        if iteration.decode:
            self.observer.on_decode(len(iteration.decode), seconds)
        if iteration.chunks:
            self.observer.on_prefill(sum(n for _, n in iteration.chunks), seconds)
        outputs = self.outputs
        for task, out in zip(iteration.decode, decoded, strict=True):
            outputs.decoded(task, out)
        for (ingest, n), chunk in zip(iteration.chunks, fed, strict=True):
            outputs.fed(ingest, n, chunk)

    def _one_by_one(
        self,
        decoding: list[DecodeTask],
        decode_rows: list[DecodeRow],
        chunks: list[tuple[IngestTask, int]],
        chunk_rows: list[ChunkRow],
    ) -> None:
        """After a step of several rows failed: each row runs alone, so that only the rows that fail alone fail
        (one failing row fails alone: a value one request sent must not fail the requests batched with it). A row
        gives the same results alone as batched (txl: batched == alone), so the others go on exactly. A failed
        device ends them all: it can no longer be trusted."""
        outputs = self.outputs
        for i, (task, row) in enumerate(zip(decoding, decode_rows, strict=True)):
            try:
                (out,), _ = self.runner.run([row], [])
            except Exception as exc:
                self._failed_step([task], [], exc)
                if self.device_error is not None:
                    self._failed_step(decoding[i + 1 :], [t for t, _ in chunks], exc)
                    return
                continue
            outputs.decoded(task, out)
        for i, ((ingest, n), chunk) in enumerate(zip(chunks, chunk_rows, strict=True)):
            try:
                _, (fed,) = self.runner.run([], [chunk])
            except Exception as exc:
                self._failed_step([], [ingest], exc)
                if self.device_error is not None:
                    self._failed_step([], [t for t, _ in chunks[i + 1 :]], exc)
                    return
                continue
            outputs.fed(ingest, n, fed)

    def _failed_step(self, decoding: list[DecodeTask], ingesting: list[IngestTask], exc: Exception) -> None:
        log.exception("a step failed")
        self._device_failed(exc)
        scheduler = self.scheduler
        self.outputs.fail(
            [t for t in decoding if t in scheduler.decoding],
            [t for t in ingesting if t in scheduler.ingesting],
            exc,
        )

    def _device_failed(self, exc: Exception) -> bool:
        """Whether the device has failed, `exc` confirmed as its end by asking the device (`device_failure`):
        a CUDA error the device runs on after fails the step's requests and nothing more."""
        if self.device_error is None and is_device_error(exc):
            if device_failure.device_failed(exc, self.pool.layout.device):
                self.device_error = first_line(exc)
                log.error("the device failed (%s): reporting not ready", self.device_error)
            else:
                log.warning("a CUDA error the device runs on after (%s): serving on", first_line(exc))
        return self.device_error is not None

    # ------------------------------------------------------------------ overlapped decoding

    def _launch(self, tasks: list[DecodeTask]) -> bool:
        """Decoding with the host a step ahead of the device (vLLM's asynchronous scheduling, SGLang's overlap
        scheduler): the next iteration is sent before the previous one's tokens are read, since its rows need
        only that iteration's memories and hidden states, which stay on the device; the host then handles the
        previous iteration's tokens (text, stop strings, events) while the device runs this one. A task that the
        previous tokens end (a stop string, its last token, a cancellation) has had one row computed for nothing,
        which is dropped. False: these rows cannot run as a graph (the caller runs them in step)."""
        # A task whose step in flight is its last one gets no further row.
        tasks = [t for t in tasks if len(t.token_ids) + (t.ahead is not None) < t.job.max_tokens]
        rows = [t.next_row() for t in tasks]
        if not rows or not self.runner.can_launch(rows):
            return False
        started = time.perf_counter()
        self._outbox.flush()  # the loop handles the last step's events while this one computes
        try:
            launched = self.runner.launch(rows)
        except Exception as exc:
            self._finish_pending()
            if self._device_failed(exc) or len(rows) == 1:
                self._failed_step(tasks, [], exc)
            else:
                log.warning(
                    "a step of %d rows failed (%s): running them one by one", len(rows), first_line(exc)
                )
                left = [t for t in tasks if t in self.scheduler.decoding]  # the pending tokens ended some
                self._one_by_one(left, [t.next_row() for t in left], [], [])
            return True
        for task, memory, hidden in zip(tasks, launched.memories, launched.hidden, strict=True):
            task.ahead = (launched, memory, hidden)
        previous, self._pending = self._pending, Pending(launched, tasks, started)
        if previous is not None:
            self._collect(previous)
        return True

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._collect(pending)

    def _collect(self, pending: Pending[DecodeTask]) -> None:
        try:
            outputs = pending.launched.collect()
        except Exception as exc:
            self._failed_step(pending.tasks, [], exc)
            for memory in pending.launched.memories:  # those of tasks that had ended meanwhile too
                memory.release()
            return
        self.observer.on_decode(len(pending.tasks), time.perf_counter() - pending.started)
        decoding = self.scheduler.decoding
        for task, out in zip(pending.tasks, outputs, strict=True):
            if task.ahead is not None and task.ahead[0] is pending.launched:
                task.ahead = None
            if task in decoding:  # not finished, failed or cancelled meanwhile (then released)
                self.outputs.decoded(task, out)
            else:
                out.memory.release()
