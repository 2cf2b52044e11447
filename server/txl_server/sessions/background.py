"""Background responses: their work runs in this process, their state lives in Redis (store/jobs.py), so any
replica answers a poll, a cancel or a resumed stream.

A cancel asked of any replica marks the job (`cancel`); the replica running it sees the mark within
`CANCEL_POLL_SECONDS` (at once if it was asked itself) and cancels the work, which commits nothing if its step had
not committed yet (the session is as it was). A job whose replica stopped or died before it finished (its
heartbeat no longer names that process) is found `failed`, with that reason, by the next one to read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from .store.heartbeats import HeartbeatStore
from .store.jobs import Job, JobStore

log = logging.getLogger(__name__)

CANCEL_POLL_SECONDS = 0.1
INTERRUPTED = {
    "code": "server_error",
    "message": "interrupted: the server running this background response stopped (or restarted) before it "
    "finished; nothing of it was committed",
}


class BackgroundJobs:
    def __init__(self, store: JobStore, heartbeats: HeartbeatStore, *, holder: str) -> None:
        self.store = store
        self.heartbeats = heartbeats
        self.holder = holder  # this replica's id, which names the jobs it runs
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.stopping = False  # set at shutdown: the jobs it ends were interrupted, not cancelled
        # Jobs asked to stop. Their work also checks this between its events: a cancellation that lands inside a
        # Redis call can be absorbed by the client library, and must not let the work go on.
        self.stop_asked: set[str] = set()

    async def announce(
        self, response_id: str, *, owner: str, response: dict[str, Any], events: list[dict[str, Any]]
    ) -> None:
        """Writes a new job of the owner's, run by this process: its response as it stands and its first events."""
        await self.store.write(response_id, response=response, events=events, owner=owner, holder=self.holder)

    async def write(
        self,
        response_id: str,
        *,
        response: dict[str, Any] | None = None,
        events: list[dict[str, Any]] | None = None,
    ) -> None:
        """The job's progress: its response object as it stands now (None: unchanged), and its next events."""
        await self.store.write(response_id, response=response, events=events)

    async def events(self, response_id: str, start: int) -> list[dict[str, Any]]:
        """The job's events from sequence number `start` on (those written so far)."""
        return await self.store.events(response_id, start)

    def start(self, response_id: str, work: Coroutine[Any, Any, Any]) -> None:
        """Runs `work` (which writes the job's progress) until it ends or the job is cancelled."""
        task = asyncio.create_task(work)
        self.tasks[response_id] = task
        watcher = asyncio.create_task(self._watch(response_id, task))

        def ended(_: object) -> None:
            self.tasks.pop(response_id, None)
            self.stop_asked.discard(response_id)
            watcher.cancel()

        task.add_done_callback(ended)

    def asked_to_stop(self, response_id: str) -> bool:
        return response_id in self.stop_asked

    def _stop(self, response_id: str, task: asyncio.Task[Any]) -> None:
        self.stop_asked.add(response_id)
        if not task.cancelling():
            task.cancel()

    async def _watch(self, response_id: str, task: asyncio.Task[Any]) -> None:
        key = self.store.keys.job(response_id)
        while not task.done():
            await asyncio.sleep(CANCEL_POLL_SECONDS)
            with contextlib.suppress(Exception):
                if await self.store.redis.hexists(key, "cancel"):
                    self._stop(response_id, task)
                    return

    async def find(self, owner: str, response_id: str) -> Job | None:
        """The owner's job; one whose replica is gone before it finished is marked `failed` first."""
        job = await self.store.find(owner, response_id)
        # This process's own jobs are alive (its work writes their end, whatever ends it).
        if job is None or job.finished or job.holder == self.holder:
            return job
        if await self.heartbeats.live([job.holder]):
            return job
        response = {**job.response, "status": "failed", "error": INTERRUPTED}
        number = await self.store.count(response_id)
        error = {"type": "server_error", "param": None, **INTERRUPTED}
        events: list[dict[str, Any]] = [
            {**error, "type": "error", "sequence_number": number, "error": error},
            {"type": "response.failed", "sequence_number": number + 1, "response": response},
        ]
        await self.store.write(response_id, response=response, events=events)
        return await self.store.find(owner, response_id)

    async def cancel(self, owner: str, job: Job, wait_seconds: float) -> Job:
        """Asks the job to stop; answers it as it stands once it has finished (or after `wait_seconds`)."""
        if job.finished:
            return job
        await self.store.ask_cancel(job.response_id)
        task = self.tasks.get(job.response_id)
        if task is not None:
            self._stop(job.response_id, task)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), wait_seconds)
        else:
            deadline = asyncio.get_running_loop().time() + wait_seconds
            while asyncio.get_running_loop().time() < deadline:
                found = await self.find(owner, job.response_id)
                if found is None or found.finished:
                    break
                await asyncio.sleep(CANCEL_POLL_SECONDS)
        return await self.find(owner, job.response_id) or job

    async def delete(self, owner: str, job: Job, wait_seconds: float) -> None:
        """Forgets a job (stopping it first if it runs)."""
        if not job.finished:
            await self.cancel(owner, job, wait_seconds)
        await self.store.delete(job.response_id)

    async def stop(self) -> None:
        """At shutdown: every job this process runs ends (as cancelled, committing nothing)."""
        self.stopping = True
        tasks = list(self.tasks.items())
        for response_id, task in tasks:
            self._stop(response_id, task)
        for _, task in tasks:
            with contextlib.suppress(BaseException):
                await task
