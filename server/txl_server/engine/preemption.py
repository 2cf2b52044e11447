"""When the device's pool has had no blocks for anything for a while: which job gives its blocks back, and how it
comes back (vLLM's preemption by recomputation), and which job fails because it could never fit.

A job holds its input state for its whole run (engine.jobs), and that input never changes, so a preempted job loses
nothing it cannot compute again: its task's progress (the states it advanced to, the boundaries it reached, its
step in flight) goes back to the pool at once, and the job is queued again from its input, unseen by its client:
the same seed samples the same tokens, and the events its client has are not sent twice (engine.outputs). The
scheduler picks the youngest job of the lowest lane among those holding blocks of their own (re-queueing one that
holds none frees nothing). A job fails only when it could never fit: its next step needs more blocks than the pool
holds beside its own input.
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


def requeue(
    task: DecodeTask | IngestTask, scheduler: Scheduler[DecodeTask, IngestTask], outputs: Outputs
) -> None:
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


def never_fitting(
    scheduler: Scheduler[DecodeTask, IngestTask], pool: BlockPool
) -> list[DecodeTask | IngestTask]:
    """The queued jobs whose next step needs more blocks than the pool holds beside their own input."""
    tasks: list[DecodeTask | IngestTask] = [*scheduler.ingesting, *scheduler.decoding]
    return [task for task in tasks if _needs(task, scheduler.segment_len) + _own(task) > pool.capacity]


def memory_full() -> Overloaded:
    """No room on the device now (restoring a session to a full device): retrying may succeed."""
    return Overloaded("the device's memory is full; retry shortly", retry_after=1.0, code=DEVICE_MEMORY_FULL)


def too_large() -> PayloadTooLarge:
    """A request that could never fit the device's memory (retrying cannot help)."""
    return PayloadTooLarge(
        "the request needs more of the device's memory than it has; use a shorter memory or segment",
        code=DEVICE_MEMORY_FULL,
    )


def _needs(task: DecodeTask | IngestTask, segment_len: int) -> int:
    if isinstance(task, DecodeTask):
        return task.new_blocks(1, set())
    return task.new_blocks(min(segment_len, task.pending, task.chunk_limit), set())


def _own(task: DecodeTask | IngestTask) -> int:
    """The blocks of the job's input, which it holds whatever happens."""
    return int(task.job.state.memory.block_ids().size)
