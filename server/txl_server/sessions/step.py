"""The atomic versioned step: how any change to a session runs and commits.

A step waits for its place in the session's queue in this process (request_queue.py), then takes the session's
single-writer lease and reads its committed metadata in one round trip (store/leases.py), and brings its state to
the device (placement.py). The new state is computed on the side, never in place; then the new version is
committed in Redis with a version check (with its stored version, in persistence mode `always`), and only then
does the state cache point to it. A step that fails, is cancelled or loses the commit leaves the session exactly
as it was; a commit once begun runs to its end even if the request awaiting it is cancelled (`to_the_end`). The
lease is renewed while the worker runs a long step, and handed back by the commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

from ..engine.jobs import AdvanceJob, AdvanceResult, GenerateResult, Job, ProgressEvent, job_result, run_job
from ..engine.state import ModelState
from ..engine.worker import Worker
from ..errors import Conflict, NotFound
from ..settings import Settings
from ..telemetry.spans import commit_written, session_held, span_start, traced
from .observer import SessionObserver
from .persistence import Persistence
from .placement import Placement
from .recovery import Lost, gone_error
from .request_queue import RequestQueues
from .state_cache import DEVICE
from .store.leases import Lease, LeaseStore
from .store.plumbing import now
from .store.sessions import SessionGone, SessionMeta, SessionStore
from .store.versions import VersionSummary

T = TypeVar("T")
Progress = Callable[[int, int], None]  # (tokens_done, tokens_total)


async def to_the_end(step: Coroutine[Any, Any, T]) -> T:
    """Runs `step` to its end even if the request awaiting it is cancelled meanwhile (its client left, the server
    stops): a commit is one step in Redis and in the cache together, never half of one. Work cancelled before
    its commit began commits nothing; once it began, the request finishes as if its client were still there."""
    task = asyncio.ensure_future(step)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()


class Steps:
    def __init__(
        self,
        *,
        settings: Settings,
        worker: Worker,
        store: SessionStore,
        leases: LeaseStore,
        placement: Placement,
        persistence: Persistence,
        observer: SessionObserver,
        holder: str,
    ) -> None:
        self.settings = settings
        self.worker = worker
        self.store = store
        self.leases = leases
        self.placement = placement
        self.persistence = persistence
        self.observer = observer
        self.holder = holder  # this replica's id: the holder of every version it commits
        self.queues = RequestQueues()

    @contextlib.asynccontextmanager
    async def hold(self, owner: str, session_id: str) -> AsyncIterator[tuple[SessionMeta, ModelState, Lease]]:
        """The owner's session for one step: its committed metadata, under its lease, and its state on the device
        (pinned there while the block runs)."""
        async with contextlib.AsyncExitStack() as stack:
            since = span_start()
            try:  # the committed metadata, under the lease; 404 before 409 (a foreign session's state is private)
                wait = await stack.enter_async_context(self._first_in_line(owner, session_id))
                meta, lease = await stack.enter_async_context(
                    self.leases.step(session_id, owner, self.settings.lease_ttl_seconds, wait_seconds=wait())
                )
            except Conflict:
                self.observer.on_conflict()
                raise
            session_held(owner, session_id, since=since)
            state = await self.placement.fetch(meta)
            cache = self.placement.cache
            cache.pin(session_id)
            try:
                yield meta, state, lease
            finally:
                cache.unpin(session_id)

    @contextlib.asynccontextmanager
    async def exclusive(self, owner: str, session_id: str) -> AsyncIterator[Lease]:
        """The session's lease, for a change that is no step (deleting it): nobody steps it meanwhile."""
        async with (
            self._first_in_line(owner, session_id) as wait,
            self.leases.lease(session_id, self.settings.lease_ttl_seconds, wait_seconds=wait()) as lease,
        ):
            yield lease

    @contextlib.asynccontextmanager
    async def _first_in_line(self, owner: str, session_id: str) -> AsyncIterator[Callable[[], float]]:
        """This request's place at the head of the session's queue in this process (waiting for those before
        it), yielding how much of `lease_wait_seconds` is left to wait for a writer elsewhere."""
        deadline = time.monotonic() + self.settings.lease_wait_seconds
        async with self.queues.first_in_line(
            owner, session_id, wait_seconds=self.settings.lease_wait_seconds
        ):
            yield lambda: max(0.0, deadline - time.monotonic())

    @traced("session.commit")
    async def commit(
        self,
        meta: SessionMeta,
        state: ModelState,
        tokens: int,
        *,
        lease: Lease,
        kind: str,
        text: str | None = None,
    ) -> SessionMeta:
        """Commits `state` as the version after `meta`'s, holding `tokens` tokens of text (`kind` and `text`: what
        the step was and what it added, for the versions list). With persistence `always`, only the blocks Redis
        does not hold yet are written."""
        new = dataclasses.replace(
            meta,
            tokens=tokens,
            mem_tokens=state.memory.length,
            version=meta.version + 1,
            last_used=now(),
            tier=DEVICE,
            holder=self.holder,
        )
        summary = VersionSummary.of(new.version, new.tokens, new.last_used, kind, text)
        persistence = self.persistence
        version = await persistence.version_write(state, summary) if persistence.always else None
        commit_written(new.version, self.settings.persistence, version)

        async def commit() -> None:
            try:
                await write()
            except SessionGone:  # declared lost meanwhile (its holder looked dead): gone for every replica
                fresh = await self.store.get(meta.id)
                raise gone_error(fresh.gone if fresh is not None else Lost.CRASHED) from None
            await self.placement.place(new, state, summary=summary)

        async def write() -> None:
            expected, token = meta.version, lease.token
            if version is None:
                # In "evict" mode an older stored version may sit in Redis: drop it with the commit, it is stale.
                committed = await self.store.commit(
                    new, expected_version=expected, drop_stored=True, lease_token=token
                )
            else:
                committed = await persistence.write(
                    lambda w: self.store.commit(new, expected_version=expected, write=w, lease_token=token),
                    version,
                    state,
                )
            if not committed:
                raise NotFound(f"no session {meta.id!r}", param="session_id")
            lease.released = True  # handed back by the commit

        await to_the_end(commit())
        return new

    async def run(
        self, job: Job, lease: Lease | None = None, *, progress: Progress | None = None
    ) -> AdvanceResult | GenerateResult:
        """The job's result; its progress events (an AdvanceJob's, with report_progress) go to `progress`."""

        def report(event: Any) -> None:
            if isinstance(event, ProgressEvent) and progress is not None:
                progress(event.done, event.total)

        if progress is not None and isinstance(job, AdvanceJob):
            progress(0, len(job.tokens))
        async with self._renewing(lease):
            result: AdvanceResult | GenerateResult = await job_result(self.worker, job, report)
        return result

    async def events(self, job: Job, lease: Lease | None) -> AsyncGenerator[Any, None]:
        """The job's events as the worker sends them, the lease kept meanwhile."""
        async with self._renewing(lease), contextlib.aclosing(run_job(self.worker, job)) as events:
            async for event in events:
                yield event

    @contextlib.asynccontextmanager
    async def _renewing(self, lease: Lease | None) -> AsyncIterator[None]:
        """Keeps `lease` (if any) while the block runs: a long step outlives the lease's TTL."""

        async def keep(lease: Lease) -> None:
            while True:
                await asyncio.sleep(lease.ttl_seconds / 3)
                with contextlib.suppress(Exception):
                    await self.leases.renew(lease)

        renewer = asyncio.create_task(keep(lease)) if lease is not None else None
        try:
            yield
        finally:
            if renewer is not None:
                renewer.cancel()
