"""The device worker: one thread that owns the model and the memory pool and runs every forward pass.

Each iteration it (1) admits new jobs and drops cancelled ones, (2) lets the scheduler pick the work: every
decoding row and segments of ingesting jobs (prompts, appends, scoring) under a token budget, and (3) runs it as
one forward (`ModelRunner`): decoding rows sample their token on the device and feed it beside the segments.
Then it hands out what happened: tokens and text to generating jobs, progress and results to ingesting ones.
Handlers never touch the model: they submit jobs and await their events. Work that writes the device's memory
pool from outside a step (restoring a session to the device) runs here too, between iterations (`call`).
"""

from __future__ import annotations

import gc
import itertools
import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from txl import BlockPool, Memory, PoolExhausted, TransfoXLLMHeadModel
from txl.kernels import prefer
from txl.paged.rows import new_blocks
from txl.tokenizers import Tokenizer
from txl.window import WindowRule

from ..errors import Overloaded, Unavailable
from .graphs import DecodeGraphs, Launched
from .jobs import (
    AdvanceJob,
    AdvanceResult,
    Boundary,
    CallJob,
    DoneEvent,
    ErrorEvent,
    GenerateJob,
    GenerateResult,
    Job,
    Outbox,
    ProgressEvent,
    TokenEvent,
    TopLogprobs,
)
from .runner import ChunkOut, ChunkRow, DecodeOut, DecodeRow, ModelRunner
from .scheduler import Iteration, Scheduler
from .state import ModelState
from .text import GenerationText

log = logging.getLogger(__name__)

# With a pool that may not grow: how long nothing may run for lack of blocks before a job is preempted, and how
# long the loop waits between looks meanwhile.
PREEMPT_AFTER_SECONDS = 2.0
STARVED_WAIT_SECONDS = 0.01
COLLECT_INTERVAL_SECONDS = 0.1


class WorkerObserver:
    """Hooks for metrics; the defaults do nothing."""

    def on_prefill(self, tokens: int, seconds: float) -> None: ...

    def on_decode(self, batch_size: int, seconds: float) -> None: ...

    def on_queue(self, queued: int, active: int) -> None: ...

    def on_cancel(self) -> None: ...


_arrivals = itertools.count()


@dataclass(eq=False)
class _Ingest:
    """A job feeding its input segment by segment: an AdvanceJob, or a GenerateJob's prompt."""

    job: AdvanceJob | GenerateJob
    state: ModelState
    tokens: list[int]
    score: bool  # log p of every input token
    top_k: int  # with score: the k most likely tokens at each position
    cursor: int = 0
    arrival: int = field(default_factory=lambda: next(_arrivals))  # the youngest is preempted first
    # Scoring, kept on the device until the job ends: one tensor of log-probs per segment.
    logprobs: list[Tensor] = field(default_factory=list)
    top: list[TopLogprobs | None] = field(default_factory=list)
    boundaries: int = 0  # > 0: segments end on multiples of it (AdvanceJob.boundaries)
    # (state, index in `logprobs` of its segments' end) at each boundary reached
    reached: list[tuple[ModelState, int]] = field(default_factory=list)

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.cursor

    @property
    def chunk_limit(self) -> int:
        """The most tokens its next segment may feed: up to the next boundary, if it keeps them."""
        if not self.boundaries:
            return self.pending
        return self.boundaries - self.state.fed % self.boundaries


@dataclass(eq=False)
class _Decode:
    job: GenerateJob
    state: ModelState
    text: GenerationText
    seed: int
    prompt: _Ingest | None = None  # the prompt phase, whose scores go in the result
    prompt_logprobs: list[float] | None = None
    token_ids: list[int] = field(default_factory=list)
    sampled_logprobs: list[float] = field(default_factory=list)
    held: TokenEvent | None = None  # the last token's event, kept while text may still be released after it
    arrival: int = field(default_factory=lambda: next(_arrivals))
    # Its step in flight, with overlapped decoding: (that iteration, the memory and hidden state after it).
    ahead: tuple[Launched, Memory, Tensor] | None = None


@dataclass(frozen=True)
class _Pending:
    """A decoding iteration sent and not yet read back."""

    launched: Launched
    tasks: list[_Decode]
    started: float


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
        graphs: bool = False,
        max_mem_len: int | None = None,
        observer: WorkerObserver | None = None,
        overlap: bool = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.segment_len = segment_len
        self.max_batch_size = max_batch_size
        self.max_queued = max_queued
        self.pool = pool if pool is not None else model.empty_memory().pool
        self.scheduler = Scheduler(
            segment_len=segment_len,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens or max(2 * segment_len, max_batch_size + segment_len),
        )
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
        decode_graphs = None
        if graphs:  # CUDA graphs for decoding iterations (on a CPU: the same static buffers, run eagerly)
            decode_graphs = DecodeGraphs(
                model,
                self.pool,
                max_batch_size=max_batch_size,
                max_positions=self.max_positions,
                capture=self.pool.layout.device.type == "cuda",
            )
        self.runner = ModelRunner(model, self.pool, decode_graphs)
        # Decoding one step ahead of the device (graphs only: `_launch`); the iteration sent and not yet read.
        self.overlap = overlap and decode_graphs is not None
        self._pending: _Pending | None = None
        # The decoding attention kernel (txl.kernels.prefer), chosen and checked at start-up (engine.selfcheck).
        self.attention = "auto"
        self.observer = observer or WorkerObserver()
        # Called (on this thread) with the blocks an iteration lacks when a pool that may not grow is full: the
        # session service then moves idle sessions off the device. Work that still cannot run is preempted.
        self.on_pool_pressure: Callable[[int], None] | None = None
        self._starved_since: float | None = None
        self._collected_at = 0.0
        # Set when a step fails with an error of the device itself (a CUDA error poisons the whole context):
        # the server then reports not ready, so that an orchestrator restarts it.
        self.device_error: str | None = None
        self._cv = threading.Condition()
        self._inbox: list[Job] = []
        self._ingesting: deque[_Ingest] = deque()
        self._decoding: list[_Decode] = []
        self._waiting: dict[_Ingest, _Decode] = {}  # generate jobs still feeding their prompt
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._outbox = Outbox()  # events held back until the worker next computes or waits

    # ------------------------------------------------------------------ control (event loop side)

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
        with self._cv:
            if self._stopping:
                raise Unavailable("the server is shutting down")
            if not isinstance(job, CallJob) and self._load() >= self.max_queued:
                raise Overloaded("too many requests are in progress; retry shortly", retry_after=1.0)
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
        return len(self._ingesting) + len(self._decoding)

    def _load(self) -> int:
        return len(self._inbox) + self.active_jobs

    # ------------------------------------------------------------------ loop (worker thread)

    def _run(self) -> None:
        with torch.inference_mode(), prefer(self.attention), self._outbox.holding():
            while self._wait_for_work():
                self._iterate()
            self._finish_pending()
        shutdown = Unavailable("the server is shutting down")
        for job in [*(t.job for t in self._ingesting), *(t.job for t in self._decoding), *self._inbox]:
            job.emit(ErrorEvent(shutdown))

    def _wait_for_work(self) -> bool:
        with self._cv:
            while not self._stopping and not self._inbox and not self._ingesting and not self._decoding:
                self._outbox.flush()
                self._cv.wait()
            return not self._stopping

    def _iterate(self) -> None:
        """One iteration. Its own frame: nothing of a finished job (whose states hold memory blocks) stays
        referenced while the worker waits for the next."""
        with self._cv:
            new, self._inbox = self._inbox, []
        for job in new:
            self._admit(job)
        self._drop_cancelled()
        self.observer.on_queue(len(self._inbox), self.active_jobs)
        iteration = self._fit(self.scheduler.next(self._decoding, self._ingesting))
        if iteration:
            self._step(iteration)
        elif self._pending is not None:
            self._finish_pending()
        elif self._decoding or self._ingesting:  # waiting for blocks: others' commits and evictions free them
            self._outbox.flush()
            with self._cv:
                self._cv.wait(STARVED_WAIT_SECONDS)
        self.observer.on_queue(len(self._inbox), self.active_jobs)

    # ------------------------------------------------------------------ admission to a pool that never grows

    def _fit(self, iteration: Iteration[_Decode, _Ingest]) -> Iteration[_Decode, _Ingest]:
        """The part of the iteration whose new blocks the pool has (all of it where the pool may grow). What is
        left out waits for a later iteration; if nothing can run, idle sessions are asked to leave the device
        (`on_pool_pressure`), and if that does not free enough within PREEMPT_AFTER_SECONDS, the youngest job is
        preempted with a retryable error (as vLLM preempts its newest requests), so that the others finish."""
        if self.pool.growable or not iteration:
            self._starved_since = None
            return iteration
        fitted, lacking = self._fitting(iteration)
        now = time.monotonic()
        if not fitted and now - self._collected_at >= COLLECT_INTERVAL_SECONDS:
            # Blocks are freed when the last table holding them goes; one held by a reference cycle (a failed
            # request's traceback) goes only when the cycle collector runs.
            self._collected_at = now
            gc.collect()
            fitted, lacking = self._fitting(iteration)
        if lacking and self.on_pool_pressure is not None:
            self.on_pool_pressure(lacking)
        if fitted:
            self._starved_since = None
        elif self._starved_since is None:
            self._starved_since = now
        elif now - self._starved_since >= PREEMPT_AFTER_SECONDS:
            self._preempt_youngest()
            self._starved_since = None
        return fitted

    def _fitting(self, iteration: Iteration[_Decode, _Ingest]) -> tuple[Iteration[_Decode, _Ingest], int]:
        """The rows of `iteration` whose new blocks are free now (in order), and the blocks the others need."""
        free = self.pool.available_blocks
        claimed: set[int] = set()  # blocks a row of this iteration extends in place: others sharing them copy
        lacking = 0
        decode: list[_Decode] = []
        chunks: list[tuple[_Ingest, int]] = []
        for task in iteration.decode:
            need = new_blocks(self.pool, self._decode_row(task).memory.rows[0], 1, claimed)
            if need <= free:
                decode.append(task)
                free -= need
            else:
                lacking += need
        for ingest, n in iteration.chunks:
            need = new_blocks(self.pool, ingest.state.memory.rows[0], n, claimed)
            if need <= free:
                chunks.append((ingest, n))
                free -= need
            else:
                lacking += need
        return Iteration(decode, chunks), lacking

    def _preempt_youngest(self) -> None:
        tasks: list[_Ingest | _Decode] = [*self._ingesting, *self._decoding]
        if not tasks:
            return
        youngest = max(tasks, key=lambda t: t.arrival)
        log.warning("the device's memory pool is full: preempting the newest request")
        error = Overloaded("the device's memory is full; retry shortly", retry_after=1.0)
        if isinstance(youngest, _Ingest):
            self._fail([], [youngest], error)
        else:
            self._fail([youngest], [], error)

    def _admit(self, job: Job) -> None:
        if isinstance(job, CallJob):
            try:
                result = job.function()
            except PoolExhausted as exc:  # restoring a session to a full device: retryable
                log.info("no room on the device: %s", exc)
                if self.on_pool_pressure is not None:
                    self.on_pool_pressure(1)
                job.emit(
                    ErrorEvent(Overloaded("the device's memory is full; retry shortly", retry_after=1.0))
                )
            except Exception as exc:  # the caller gets the error
                job.emit(ErrorEvent(exc))
            else:
                job.emit(DoneEvent(result))
            return
        if not isinstance(job, AdvanceJob | GenerateJob):  # pragma: no cover - programming error
            job.emit(ErrorEvent(TypeError(f"unknown job {type(job).__name__}")))
            return
        try:
            state = self._on_pool(job.state)
        except Exception as exc:
            job.emit(ErrorEvent(exc))
            return
        if isinstance(job, AdvanceJob):
            if not job.tokens:  # nothing to feed: the state is the result
                job.emit(DoneEvent(AdvanceResult(state, 0, 0.0, [] if job.token_logprobs else None, None)))
                return
            top_k = job.top_logprobs if job.token_logprobs else 0
            self._ingesting.append(_Ingest(job, state, job.tokens, True, top_k, boundaries=job.boundaries))
            return
        decoder = self.tokenizer.decoder(list(state.tail) + job.prompt)
        seed = job.sampling.seed if job.sampling.seed is not None else secrets.randbits(63)
        task = _Decode(job, state, GenerationText(decoder, job.stop), seed)
        if job.prompt:
            prompt = _Ingest(
                job, state, job.prompt, job.prompt_logprobs, job.top_logprobs if job.prompt_logprobs else 0
            )
            task.prompt = prompt
            self._waiting[prompt] = task
            self._ingesting.append(prompt)
        else:
            self._start_decoding(task)

    def _on_pool(self, state: ModelState) -> ModelState:
        """The state with its memory in this worker's pool (a state made elsewhere is copied in once)."""
        if state.memory.pool is self.pool:
            return state
        return ModelState(state.memory.to_pool(self.pool), state.last_hidden, state.tail)

    def _drop_cancelled(self) -> None:
        tasks: list[_Ingest | _Decode] = [*self._ingesting, *self._decoding]
        cancelled = [t for t in tasks if t.job.cancelled]
        if not cancelled:
            return
        self._ingesting = deque(t for t in self._ingesting if not t.job.cancelled)
        self._decoding = [t for t in self._decoding if not t.job.cancelled]
        for task in cancelled:
            if isinstance(task, _Ingest):
                self._waiting.pop(task, None)
            self.observer.on_cancel()
            task.job.emit(ErrorEvent(CancelledByClient()))

    # ------------------------------------------------------------------ one iteration

    def _decode_row(self, task: _Decode) -> DecodeRow:
        """The row a decoding task feeds next: after its step in flight, if it has one."""
        memory, last = task.state.memory, task.state.last_hidden
        counter = len(task.token_ids)
        if task.ahead is not None:
            _, memory, last = task.ahead
            counter += 1
        assert last is not None  # decoding states always have one
        return DecodeRow(memory, last, task.job.sampling, task.seed, counter, task.job.top_logprobs)

    def _step(self, iteration: Iteration[_Decode, _Ingest]) -> None:
        if self.overlap and iteration.decode and not iteration.chunks and self._launch(iteration.decode):
            return
        if self._pending is not None:  # its tokens first: they may end some of this iteration's tasks
            self._finish_pending()
            iteration = Iteration([t for t in iteration.decode if t in self._decoding], iteration.chunks)
            if not iteration:
                return
        started = time.perf_counter()
        decode_rows = [self._decode_row(t) for t in iteration.decode]
        chunk_rows = [
            ChunkRow(t.state.memory, t.tokens[t.cursor : t.cursor + n], t.state.last_hidden, t.score, t.top_k)
            for t, n in iteration.chunks
        ]
        self._outbox.flush()  # the loop handles the last step's events while this one computes
        try:
            decoded, fed = self.runner.run(decode_rows, chunk_rows)
        except Exception as exc:
            self._failed_step(iteration.decode, [t for t, _ in iteration.chunks], exc)
            return
        seconds = time.perf_counter() - started
        if iteration.decode:
            self.observer.on_decode(len(iteration.decode), seconds)
        if iteration.chunks:
            self.observer.on_prefill(sum(n for _, n in iteration.chunks), seconds)
        for task, out in zip(iteration.decode, decoded, strict=True):
            self._decoded(task, out)
        for (ingest, n), chunk in zip(iteration.chunks, fed, strict=True):
            self._fed(ingest, n, chunk)

    def _failed_step(self, decoding: list[_Decode], ingesting: list[_Ingest], exc: Exception) -> None:
        log.exception("a step failed")
        if is_device_error(exc) and self.device_error is None:
            self.device_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.error("the device failed (%s): reporting not ready", self.device_error)
        self._fail(
            [t for t in decoding if t in self._decoding], [t for t in ingesting if t in self._ingesting], exc
        )

    # ------------------------------------------------------------------ overlapped decoding

    def _launch(self, tasks: list[_Decode]) -> bool:
        """Decoding with the host a step ahead of the device (vLLM's asynchronous scheduling, SGLang's overlap
        scheduler): the next iteration is sent before the previous one's tokens are read, since its rows need
        only that iteration's memories and hidden states, which stay on the device; the host then handles the
        previous iteration's tokens (text, stop strings, events) while the device runs this one. A task that the
        previous tokens end (a stop string, its last token, a cancellation) has had one row computed for nothing,
        which is dropped. False: these rows cannot run as a graph (the caller runs them in step)."""
        # A task whose step in flight is its last one gets no further row.
        tasks = [t for t in tasks if len(t.token_ids) + (t.ahead is not None) < t.job.max_tokens]
        rows = [self._decode_row(t) for t in tasks]
        if not rows or not self.runner.can_launch(rows):
            return False
        started = time.perf_counter()
        self._outbox.flush()  # the loop handles the last step's events while this one computes
        try:
            launched = self.runner.launch(rows)
        except Exception as exc:
            self._finish_pending()
            self._failed_step(tasks, [], exc)
            return True
        for task, memory, hidden in zip(tasks, launched.memories, launched.hidden, strict=True):
            task.ahead = (launched, memory, hidden)
        previous, self._pending = self._pending, _Pending(launched, tasks, started)
        if previous is not None:
            self._collect(previous)
        return True

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._collect(pending)

    def _collect(self, pending: _Pending) -> None:
        try:
            outputs = pending.launched.collect()
        except Exception as exc:
            self._failed_step(pending.tasks, [], exc)
            return
        self.observer.on_decode(len(pending.tasks), time.perf_counter() - pending.started)
        for task, out in zip(pending.tasks, outputs, strict=True):
            if task.ahead is not None and task.ahead[0] is pending.launched:
                task.ahead = None
            if task in self._decoding:  # not finished, failed or cancelled meanwhile (then dropped)
                self._decoded(task, out)

    def _fail(self, decoding: list[_Decode], ingesting: list[_Ingest], exc: Exception) -> None:
        for task in decoding:
            self._decoding.remove(task)
            task.job.emit(ErrorEvent(exc))
        for chunk in ingesting:
            self._ingesting.remove(chunk)
            self._waiting.pop(chunk, None)
            chunk.job.emit(ErrorEvent(exc))

    # ------------------------------------------------------------------ ingestion

    def _fed(self, task: _Ingest, n: int, out: ChunkOut) -> None:
        fed = task.tokens[task.cursor : task.cursor + n]
        task.state = task.state.advanced(out.memory, out.last_hidden, fed)
        task.cursor += n
        if out.logprobs is not None:
            task.logprobs.append(out.logprobs)
        if out.top is not None:
            task.top.extend(out.top)
        if task.boundaries and task.state.fed % task.boundaries == 0:
            task.reached.append((task.state, len(task.logprobs)))
        if isinstance(task.job, AdvanceJob) and task.job.report_progress:
            task.job.emit(ProgressEvent(task.cursor, len(task.tokens)))
        if task.pending:
            return
        self._ingesting.remove(task)
        logprobs = torch.cat(task.logprobs).double().tolist() if task.logprobs else []  # one read per job
        if isinstance(task.job, AdvanceJob):
            total = math.fsum(x for x in logprobs if not math.isnan(x))
            result = AdvanceResult(
                task.state,
                len(task.tokens),
                total,
                logprobs if task.job.token_logprobs else None,
                task.top if task.top_k else None,
                _boundaries(task, logprobs),
            )
            task.job.emit(DoneEvent(result))
            return
        decoding = self._waiting.pop(task)
        decoding.state = task.state
        decoding.prompt_logprobs = logprobs
        self._start_decoding(decoding)

    # ------------------------------------------------------------------ decoding

    def _start_decoding(self, task: _Decode) -> None:
        if task.job.max_tokens <= 0:
            self._finish(task)
        elif task.state.last_hidden is None:
            task.job.emit(ErrorEvent(ValueError("nothing to continue from: the session holds no text")))
        else:
            self._decoding.append(task)

    def _decoded(self, task: _Decode, out: DecodeOut) -> None:
        self._emit_token(task, out.token, out.logprob, out.top)
        task.state = task.state.advanced(out.memory, out.last_hidden, [out.token])
        if task.text.stopped or len(task.token_ids) >= task.job.max_tokens:
            self._decoding.remove(task)
            self._finish(task)

    def _emit_token(self, task: _Decode, token: int, logprob: float, top: TopLogprobs | None) -> None:
        if task.held is not None:
            task.job.emit(task.held)
            task.held = None
        piece = task.text.push(token)
        task.token_ids.append(token)
        task.sampled_logprobs.append(logprob)
        event = TokenEvent(token, piece, logprob, top)
        ending = task.text.stopped or len(task.token_ids) >= task.job.max_tokens
        if ending or task.text.may_hold_text:
            task.held = event  # the end of the text may still be attached to it
        else:
            task.job.emit(event)

    def _finish(self, task: _Decode) -> None:
        rest = task.text.finish()
        if task.held is not None:
            held = task.held
            task.job.emit(TokenEvent(held.id, held.text + rest, held.logprob, held.top))
            task.held = None
        prompt = task.prompt
        result = GenerateResult(
            task.state,
            task.text.text,
            "stop" if task.text.stopped else "length",
            len(task.job.prompt),
            len(task.token_ids),
            task.token_ids,
            task.sampled_logprobs,
            task.prompt_logprobs if task.job.prompt_logprobs else None,
            prompt.top if prompt is not None and prompt.top_k else None,
        )
        task.job.emit(DoneEvent(result))


def _boundaries(task: _Ingest, logprobs: list[float]) -> list[Boundary]:
    """The states an ingestion reached at its boundaries, each with the log-probs of the tokens it fed since the
    one before (segments end on boundaries, so those are whole segments' log-probs)."""
    out, done, previous = [], 0, 0
    sizes = [t.numel() for t in task.logprobs]
    for state, segments in task.reached:
        fed = sum(sizes[previous:segments])
        out.append(Boundary(state, logprobs[done : done + fed]))
        done, previous = done + fed, segments
    return out


def is_device_error(exc: BaseException) -> bool:
    """An error of the accelerator itself (an illegal address, a launch failure, ECC), after which its context
    cannot be trusted: not an error of the request."""
    return isinstance(exc, torch.AcceleratorError) or (
        isinstance(exc, RuntimeError) and str(exc).startswith(("CUDA error", "CUDA driver error"))
    )


class CancelledByClient(Exception):
    """The job was cancelled (its client went away); nothing it computed was kept."""
