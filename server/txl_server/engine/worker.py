"""The device worker: one thread that owns the model and runs every forward pass.

Each iteration it (1) admits new jobs and drops cancelled ones, (2) ingests one segment of one job (prompts,
appends, scoring; round robin), and (3) runs one decode step for every generating job together: one forward
with a row per job, memories of different lengths side by side (`model(tokens, [memory, ...])`). A long
ingestion therefore delays other sessions' next tokens by at most one segment. Handlers never touch the model:
they submit jobs and await events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from txl import TransfoXLLMHeadModel
from txl.sampling import make_generator, sample_batch
from txl.tokenizers import Tokenizer

from ..errors import Overloaded, Unavailable
from .jobs import (
    AdvanceJob,
    AdvanceResult,
    DoneEvent,
    ErrorEvent,
    GenerateJob,
    GenerateResult,
    Job,
    ProgressEvent,
    TokenEvent,
    TopLogprobs,
)
from .state import ModelState
from .text import GenerationText

log = logging.getLogger(__name__)


class WorkerObserver:
    """Hooks for metrics; the defaults do nothing."""

    def on_prefill(self, tokens: int, seconds: float) -> None: ...

    def on_decode(self, batch_size: int, seconds: float) -> None: ...

    def on_queue(self, queued: int, active: int) -> None: ...

    def on_cancel(self) -> None: ...


@dataclass(eq=False)
class _Task:
    state: ModelState
    cursor: int = 0  # tokens of the input already fed
    # Log-probabilities of the fed tokens (AdvanceJob always sums them; GenerateJob only on request).
    logprob: float = 0.0
    token_logprobs: list[float] = field(default_factory=list)
    token_top: list[TopLogprobs | None] = field(default_factory=list)


@dataclass(eq=False)
class _AdvanceTask(_Task):
    job: AdvanceJob = field(kw_only=True)

    @property
    def tokens(self) -> list[int]:
        return self.job.tokens

    @property
    def scores(self) -> bool:
        return True

    @property
    def top_k(self) -> int:
        return self.job.top_logprobs if self.job.token_logprobs else 0


@dataclass(eq=False)
class _GenerateTask(_Task):
    job: GenerateJob = field(kw_only=True)
    text: GenerationText = field(kw_only=True)
    generator: torch.Generator = field(kw_only=True)
    token_ids: list[int] = field(default_factory=list)
    sampled_logprobs: list[float] = field(default_factory=list)
    held: TokenEvent | None = None  # the last token's event, kept while text may still be released after it

    @property
    def tokens(self) -> list[int]:
        return self.job.prompt

    @property
    def scores(self) -> bool:
        return self.job.prompt_logprobs

    @property
    def top_k(self) -> int:
        return self.job.top_logprobs if self.job.prompt_logprobs else 0


class Worker:
    def __init__(
        self,
        model: TransfoXLLMHeadModel,
        tokenizer: Tokenizer,
        *,
        segment_len: int,
        max_batch_size: int,
        max_queued: int,
        observer: WorkerObserver | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.segment_len = segment_len
        self.max_batch_size = max_batch_size
        self.max_queued = max_queued
        self.observer = observer or WorkerObserver()
        self._cv = threading.Condition()
        self._inbox: list[Job] = []
        self._prefill: deque[_AdvanceTask | _GenerateTask] = deque()
        self._decoding: list[_GenerateTask] = []
        self._stopping = False
        self._thread: threading.Thread | None = None

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

    def submit(self, job: Job) -> None:
        with self._cv:
            if self._stopping:
                raise Unavailable("the server is shutting down")
            if len(self._inbox) + len(self._prefill) + len(self._decoding) >= self.max_queued:
                raise Overloaded("too many requests are in progress; retry shortly", retry_after=1.0)
            self._inbox.append(job)
            self._cv.notify()

    @property
    def active_jobs(self) -> int:
        return len(self._prefill) + len(self._decoding)

    # ------------------------------------------------------------------ loop (worker thread)

    def _run(self) -> None:
        with torch.no_grad():
            while True:
                with self._cv:
                    while not self._stopping and not self._inbox and not self._prefill and not self._decoding:
                        self._cv.wait()
                    if self._stopping:
                        break
                    new, self._inbox = self._inbox, []
                for job in new:
                    self._admit(job)
                self._drop_cancelled()
                self.observer.on_queue(len(self._inbox), self.active_jobs)
                if self._prefill:
                    self._prefill_step(self._prefill[0])
                if self._decoding:
                    self._decode_step()
                self.observer.on_queue(len(self._inbox), self.active_jobs)
        shutdown = Unavailable("the server is shutting down")
        for task in [*self._prefill, *self._decoding]:
            task.job.emit(ErrorEvent(shutdown))
        for job in self._inbox:
            job.emit(ErrorEvent(shutdown))

    def _admit(self, job: Job) -> None:
        if isinstance(job, AdvanceJob):
            self._prefill.append(_AdvanceTask(job.state, job=job))
        elif isinstance(job, GenerateJob):
            decoder = self.tokenizer.decoder(list(job.state.tail) + job.prompt)
            task = _GenerateTask(
                job.state,
                job=job,
                text=GenerationText(decoder, job.stop),
                generator=make_generator(job.sampling.seed),
            )
            if job.prompt:
                self._prefill.append(task)
            else:
                self._start_decoding(task)
        else:  # pragma: no cover - programming error
            job.emit(ErrorEvent(TypeError(f"unknown job {type(job).__name__}")))

    def _drop_cancelled(self) -> None:
        cancelled = [t for t in [*self._prefill, *self._decoding] if t.job.cancelled]
        if not cancelled:
            return
        self._prefill = deque(t for t in self._prefill if not t.job.cancelled)
        self._decoding = [t for t in self._decoding if not t.job.cancelled]
        for task in cancelled:
            self.observer.on_cancel()
            task.job.emit(ErrorEvent(CancelledByClient()))

    # ------------------------------------------------------------------ ingestion

    def _prefill_step(self, task: _AdvanceTask | _GenerateTask) -> None:
        started = time.perf_counter()
        chunk = task.tokens[task.cursor : task.cursor + self.segment_len]
        try:
            ids = torch.tensor([chunk], dtype=torch.long, device=self.model.device)
            hidden, memory = self.model(ids, task.state.memory)  # [1, T, D]
            hidden = hidden[0]
            if task.scores:
                self._score_chunk(task, hidden, ids[0])
            task.state = task.state.advanced(memory, hidden[-1].clone(), chunk)
            task.cursor += len(chunk)
        except Exception as exc:
            log.exception("ingestion failed")
            self._prefill.popleft()
            task.job.emit(ErrorEvent(exc))
            return
        self.observer.on_prefill(len(chunk), time.perf_counter() - started)
        self._prefill.rotate(-1)  # round robin: the next job's chunk comes next
        if isinstance(task, _AdvanceTask) and task.job.report_progress:
            task.job.emit(ProgressEvent(task.cursor, len(task.tokens)))
        if task.cursor < len(task.tokens):
            return
        self._prefill.remove(task)
        if isinstance(task, _AdvanceTask):
            result = AdvanceResult(
                task.state,
                len(task.tokens),
                task.logprob,
                task.token_logprobs if task.job.token_logprobs else None,
                task.token_top if task.top_k else None,
            )
            task.job.emit(DoneEvent(result))
        else:
            self._start_decoding(task)

    def _score_chunk(self, task: _Task, hidden: torch.Tensor, ids: torch.Tensor) -> None:
        """log p(each token of the chunk | everything before), the first predicted by the previous state."""
        last = task.state.last_hidden
        if last is None:  # nothing precedes the first token: it has no prediction
            predictors, targets = hidden[:-1], ids[1:]
        else:
            predictors, targets = torch.cat([last[None, :], hidden[:-1]]), ids
        top_k = task.top_k if isinstance(task, _AdvanceTask | _GenerateTask) else 0
        if top_k:
            full = self.model.log_probs(predictors)  # [T, V]: needed for the alternatives anyway
            logprobs = full.gather(1, targets[:, None])[:, 0].tolist() if targets.numel() else []
            tops = [_top(row, top_k) for row in full]
        else:
            logprobs = self.model.target_log_probs(predictors, targets).tolist() if targets.numel() else []
            tops = []
        task.logprob += sum(logprobs)
        first: list[float] = [float("nan")] if last is None else []
        task.token_logprobs.extend(first + logprobs)
        if top_k:
            if last is None:
                task.token_top.append(None)
            task.token_top.extend(tops)

    # ------------------------------------------------------------------ decoding

    def _start_decoding(self, task: _GenerateTask) -> None:
        if task.job.max_tokens <= 0:
            self._finish(task)
        elif task.state.last_hidden is None:
            task.job.emit(ErrorEvent(ValueError("nothing to continue from: the session holds no text")))
        else:
            self._decoding.append(task)

    def _decode_step(self) -> None:
        started = time.perf_counter()
        tasks = self._decoding[: self.max_batch_size]
        # Fairness beyond one batch: the rows that ran go to the back.
        self._decoding = self._decoding[len(tasks) :] + tasks
        try:
            last_hidden = torch.stack([t.state.last_hidden for t in tasks])  # type: ignore[misc]  # [N, D]
            log_probs = self.model.log_probs(last_hidden).cpu()  # [N, V] float32
            sampled, logprobs = sample_batch(
                log_probs, [t.job.sampling for t in tasks], [t.generator for t in tasks]
            )
            for row, task in enumerate(tasks):
                top = _top(log_probs[row], task.job.top_logprobs) if task.job.top_logprobs else None
                self._emit_token(task, sampled[row], logprobs[row], top)
            ids = torch.tensor(sampled, dtype=torch.long, device=self.model.device)[:, None]  # [N, 1]
            hidden, memories = self.model(ids, [t.state.memory for t in tasks])
        except Exception as exc:
            log.exception("decode step failed")
            for task in tasks:
                self._decoding.remove(task)
                task.job.emit(ErrorEvent(exc))
            return
        for row, task in enumerate(tasks):
            task.state = task.state.advanced(memories[row], hidden[row, 0].clone(), [sampled[row]])
            if task.text.stopped or len(task.token_ids) >= task.job.max_tokens:
                self._decoding.remove(task)
                self._finish(task)
        self.observer.on_decode(len(tasks), time.perf_counter() - started)

    def _emit_token(self, task: _GenerateTask, token: int, logprob: float, top: TopLogprobs | None) -> None:
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

    def _finish(self, task: _GenerateTask) -> None:
        rest = task.text.finish()
        if task.held is not None:
            held = task.held
            task.job.emit(TokenEvent(held.id, held.text + rest, held.logprob, held.top))
            task.held = None
        result = GenerateResult(
            task.state,
            task.text.text,
            "stop" if task.text.stopped else "length",
            len(task.job.prompt),
            len(task.token_ids),
            task.token_ids,
            task.sampled_logprobs,
            task.token_logprobs if task.job.prompt_logprobs else None,
            task.token_top if task.top_k else None,
        )
        task.job.emit(DoneEvent(result))


def _top(row: torch.Tensor, k: int) -> TopLogprobs:
    values, ids = torch.topk(row.float(), min(k, row.numel()))
    return tuple(zip(ids.tolist(), values.tolist(), strict=True))


class CancelledByClient(Exception):
    """The job was cancelled (its client went away); nothing it computed was kept."""
