"""When the device's pool has had no blocks for anything for a while: which job gives its blocks back, and whether it
runs again from its input (vLLM's preemption by recomputation) or fails.

A job holds its input state for its whole run (engine.jobs), and that input never changes, so a job re-queued loses
nothing it cannot compute again: its task's progress (the states it advanced to, the boundaries it reached, its
step in flight) goes back to the pool at once, and the job is queued again from its input, unseen by its client:
the same seed samples the same tokens, and the events its client has are not sent twice (engine.outputs).

Re-queueing frees only a job's progress, never its input, and a job that restarts takes blocks again: so the
youngest job holding progress is re-queued only for an older one that the blocks it frees let run (never for a
younger one: two jobs would take turns undoing each other). Otherwise the inputs themselves are what fills the pool
(sessions whose steps wait), and the youngest job fails with a retryable error (`memory_full`): its input then goes,
and its session may leave the device. A job whose next step needs more blocks than the pool holds beside its own
input could never fit: it fails for good (`too_large`).
"""

from __future__ import annotations

import logging

from txl import BlockPool

from ..errors import Overloaded, PayloadTooLarge
from .gate import DEVICE_MEMORY_FULL
from .outputs import Outputs
from .scheduler import Scheduler
from .tasks import DecodeTask, IngestTask

log = logging.getLogger(__name__)

Task = DecodeTask | IngestTask


def preempt(
    youngest: Task, scheduler: Scheduler[DecodeTask, IngestTask], outputs: Outputs, pool: BlockPool
) -> None:
    """Nothing could run for a while (the scheduler's `youngest` job is the last resort)."""
    tasks: list[Task] = [*scheduler.ingesting, *scheduler.decoding]
    never = [t for t in tasks if _needs(t, scheduler.segment_len) + _input_blocks(t) > pool.capacity]
    if never:
        _fail(outputs, never, too_large())
        return
    progressed = [t for t in tasks if t.progressed]
    if progressed:
        candidate = max(progressed, key=_order)
        room = pool.available_blocks + _progress_blocks(candidate)
        older = [t for t in tasks if _order(t) < _order(candidate)]
        if any(_needs(t, scheduler.segment_len) <= room for t in older):
            requeue(candidate, scheduler, outputs)
            return
    log.warning("the device's memory pool is full: the newest request fails (retryable)")
    _fail(outputs, [youngest], memory_full())


def requeue(task: Task, scheduler: Scheduler[DecodeTask, IngestTask], outputs: Outputs) -> None:
    """`task`'s job goes back to the queue from its input: what the task holds goes back to the pool now."""
    if isinstance(task, IngestTask):
        scheduler.remove_ingesting(task)
    else:
        scheduler.remove_decoding(task)
    task.release()
    log.info(
        "the device's memory pool is full: a request goes back to the queue, to run again from its input"
    )
    outputs.start(task.job, task.job.state.retain(), again=task)


def memory_full() -> Overloaded:
    """No room on the device now: retrying may succeed."""
    return Overloaded("the device's memory is full; retry shortly", retry_after=1.0, code=DEVICE_MEMORY_FULL)


def too_large() -> PayloadTooLarge:
    """A request that could never fit the device's memory (retrying cannot help)."""
    return PayloadTooLarge(
        "the request needs more of the device's memory than it has; use a shorter memory or segment",
        code=DEVICE_MEMORY_FULL,
    )


def _fail(outputs: Outputs, tasks: list[Task], error: Exception) -> None:
    outputs.fail(
        [t for t in tasks if isinstance(t, DecodeTask)],
        [t for t in tasks if isinstance(t, IngestTask)],
        error,
    )


def _order(task: Task) -> tuple[int, int]:
    """The preemption order: the lowest lane, then the last to arrive, is the largest."""
    return (task.lane, task.arrival)


def _needs(task: Task, segment_len: int) -> int:
    """The fresh blocks its next step takes."""
    if isinstance(task, DecodeTask):
        return task.new_blocks(1, set())
    return task.new_blocks(min(segment_len, task.pending, task.chunk_limit), set())


def _input_blocks(task: Task) -> int:
    """The blocks of the job's input, which it holds whatever happens."""
    return int(task.job.state.memory.block_ids().size)


def _progress_blocks(task: Task) -> int:
    """The blocks its progress holds beyond its input (what re-queueing it gives back, at most)."""
    held = set(task.state.memory.block_ids().tolist())
    if isinstance(task, DecodeTask) and task.ahead is not None:
        held |= set(task.ahead[1].block_ids().tolist())
    return len(held - set(task.job.state.memory.block_ids().tolist()))
