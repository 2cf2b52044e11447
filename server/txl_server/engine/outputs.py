"""What each step's results become for the jobs: tokens and their text (stop strings, text held back until it is
final), progress, the states reached at boundaries, results, errors. The one place that emits a running job's
events; it takes the jobs that end out of the scheduler's queues, and puts a generation whose prompt is fed into
them.
"""

from __future__ import annotations

import logging
import math

import torch
from txl.tokenizers import Tokenizer

from ..errors import RowFailed
from .jobs import (
    AdvanceJob,
    AdvanceResult,
    Boundary,
    CancelledByClient,
    DoneEvent,
    ErrorEvent,
    GenerateJob,
    GenerateResult,
    ProgressEvent,
    PromptFed,
    TokenEvent,
)
from .rows import ChunkOut, DecodeOut, TopLogprobs
from .scheduler import Scheduler
from .state import ModelState
from .tasks import DecodeTask, IngestTask

log = logging.getLogger(__name__)


class Outputs:
    def __init__(self, scheduler: Scheduler[DecodeTask, IngestTask], tokenizer: Tokenizer) -> None:
        self.scheduler = scheduler
        self.tokenizer = tokenizer

    def start(
        self,
        job: AdvanceJob | GenerateJob,
        state: ModelState,
        *,
        again: DecodeTask | IngestTask | None = None,
    ) -> None:
        """Queues `job` from `state` (its tasks' own hold). `again`: the task of the job's run that was preempted
        (engine.preemption): the job keeps its seed and its place in arrival order, and the tokens its client
        has already are not sent twice."""
        arrival = again.arrival if again is not None else None
        if isinstance(job, AdvanceJob):
            if not job.tokens:
                self.nothing_to_feed(job, state)
                return
            ingest = IngestTask.advance(job, state)
            ingest.arrival = arrival if arrival is not None else ingest.arrival
            self.scheduler.add_ingesting(ingest)
            return
        before = again.then if isinstance(again, IngestTask) else again
        task = DecodeTask.start(job, state, self.tokenizer, seed=before.seed if before is not None else None)
        task.replay = job.tokens_sent
        task.arrival = arrival if arrival is not None else task.arrival
        if job.prompt:
            ingest = IngestTask.prompt(task)
            ingest.arrival = task.arrival
            self.scheduler.add_ingesting(ingest)
        else:
            self.start_decoding(task)

    # ------------------------------------------------------------------ ingestion

    def nothing_to_feed(self, job: AdvanceJob, state: ModelState) -> None:
        """An AdvanceJob without tokens: the state (the caller's hold) is the result."""
        job.emit(DoneEvent(AdvanceResult(state, 0, 0.0, [] if job.token_logprobs else None, None)))

    def fed(self, task: IngestTask, n: int, out: ChunkOut) -> None:
        task.job.timing.fed(n)
        fed = task.tokens[task.cursor : task.cursor + n]
        before, task.state = task.state, task.state.advanced(out.memory, out.last_hidden, fed)
        before.release()
        task.cursor += n
        if out.logprobs is not None:
            task.logprobs.append(out.logprobs)
        if out.top is not None:
            task.top.extend(out.top)
        if task.boundaries and task.state.fed % task.boundaries == 0 and task.keeps_another_boundary:
            task.reached.append((task.state.retain(), len(task.logprobs)))
        if task.job.report_progress and task.cursor > task.job.progress_sent:  # not again after a preemption
            task.job.progress_sent = task.cursor
            task.job.emit(ProgressEvent(task.cursor, len(task.tokens)))
        if task.pending:
            return
        self.scheduler.remove_ingesting(task)
        logprobs = torch.cat(task.logprobs).double().tolist() if task.logprobs else []  # one read per job
        if isinstance(task.job, AdvanceJob):
            total = math.fsum(x for x in logprobs if not math.isnan(x))
            result = AdvanceResult(
                task.state,
                len(task.tokens),
                total,
                logprobs if task.job.token_logprobs else None,
                task.top if task.top_k else None,
                boundaries(task, logprobs),
            )
            task.job.emit(DoneEvent(result))
            return
        generation = task.then
        assert generation is not None  # a GenerateJob's prompt
        generation.state = task.state
        if generation.job.report_prompt_state:
            generation.job.emit(PromptFed(task.state.retain()))  # the prewrite's own hold
        generation.prompt_logprobs = logprobs
        generation.prompt_top = task.top if task.top_k else None
        self.start_decoding(generation)

    # ------------------------------------------------------------------ decoding

    def start_decoding(self, task: DecodeTask) -> None:
        if task.job.max_tokens <= 0:
            self._finish(task)
        elif task.state.last_hidden is None:
            task.release()
            task.job.emit(ErrorEvent(ValueError("nothing to continue from: the session holds no text")))
        else:
            self.scheduler.add_decoding(task)

    def decoded(self, task: DecodeTask, out: DecodeOut) -> None:
        if not math.isfinite(out.logprob):
            # The model gave this row no finite log-probabilities (the sampler then still returns an id in
            # range, and NaN for its log-prob): this request ends; the rows batched with it go on.
            log.warning("a decoding row's log-probabilities were not finite: ending its request")
            out.memory.release()
            self.fail([task], [], RowFailed())
            return
        task.job.timing.decoded()
        self._emit_token(task, out.token, out.logprob, out.top)
        before, task.state = task.state, task.state.advanced(out.memory, out.last_hidden, [out.token])
        before.release()
        if task.text.stopped or len(task.token_ids) >= task.job.max_tokens:
            self.scheduler.remove_decoding(task)
            self._finish(task)

    def _emit_token(self, task: DecodeTask, token: int, logprob: float, top: TopLogprobs | None) -> None:
        if task.held is not None:
            _send(task, task.held)
            task.held = None
        piece = task.text.push(token)
        task.token_ids.append(token)
        task.sampled_logprobs.append(logprob)
        event = TokenEvent(token, piece, logprob, top)
        ending = task.text.stopped or len(task.token_ids) >= task.job.max_tokens
        if ending or task.text.may_hold_text:
            task.held = event  # the end of the text may still be attached to it
        else:
            _send(task, event)

    def _finish(self, task: DecodeTask) -> None:
        task.state = task.state.owning()  # the session keeps it: not a view of its last batch's output
        rest = task.text.finish()
        if task.held is not None:
            held = task.held
            _send(task, TokenEvent(held.id, held.text + rest, held.logprob, held.top))
            task.held = None
        result = GenerateResult(
            task.state,
            task.text.text,
            "stop" if task.text.stopped else "length",
            len(task.job.prompt),
            len(task.token_ids),
            task.token_ids,
            task.sampled_logprobs,
            task.prompt_logprobs if task.job.prompt_logprobs else None,
            task.prompt_top,
        )
        task.job.emit(DoneEvent(result))

    # ------------------------------------------------------------------ ending early

    def fail(self, decoding: list[DecodeTask], ingesting: list[IngestTask], exc: Exception) -> None:
        """Ends these queued jobs with `exc`."""
        for task in decoding:
            self.scheduler.remove_decoding(task)
            task.release()
            task.job.emit(ErrorEvent(exc))
        for chunk in ingesting:
            self.scheduler.remove_ingesting(chunk)
            chunk.release()
            chunk.job.emit(ErrorEvent(exc))

    def cancelled(self, task: DecodeTask | IngestTask) -> None:
        """A job the scheduler dropped for its cancellation."""
        task.release()
        task.job.emit(ErrorEvent(task.job.stop_reason or CancelledByClient()))


def _send(task: DecodeTask, event: TokenEvent) -> None:
    """A token's event to its client, unless the client has it already (the job was preempted and runs again:
    the same seed samples the same tokens)."""
    if task.replay:
        task.replay -= 1
        return
    task.job.tokens_sent += 1
    task.job.emit(event)


def boundaries(task: IngestTask, logprobs: list[float]) -> list[Boundary]:
    """The states an ingestion reached at its boundaries, each with the log-probs of the tokens it fed since the
    one before (segments end on boundaries, so those are whole segments' log-probs)."""
    out, done, previous = [], 0, 0
    sizes = [t.numel() for t in task.logprobs]
    for state, segments in task.reached:
        fed = sum(sizes[previous:segments])
        out.append(Boundary(state, logprobs[done : done + fed]))
        done, previous = done + fed, segments
    return out
