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
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..engine.jobs import AdvanceJob, AdvanceResult, GenerateResult, Job, ProgressEvent, job_result, run_job
from ..engine.state import ModelState, released
from ..engine.worker import Worker
from ..errors import Conflict, InvalidRequest, NotFound, OutcomeUnknown, Unavailable
from ..settings import Settings
from ..telemetry.spans import commit_written, session_held, span_start, traced
from .observer import SessionObserver
from .persistence import Durable, Persistence, Prewrite
from .placement import Placement
from .recovery import Lost, Recovery, gone_error
from .request_queue import RequestQueues
from .settling import settled
from .state_cache import DEVICE
from .store.idempotency import Receipt
from .store.lease import Lease, new_token
from .store.leases import LeaseStore
from .store.plumbing import now
from .store.responses import ResponseWrite
from .store.sessions import Fenced, SessionGone, SessionMeta, SessionStore
from .store.versions import Replay, VersionSummary, VersionWrite

T = TypeVar("T")
Progress = Callable[[int, int], None]  # (tokens_done, tokens_total)
# The Idempotency-Key's record of the version a step commits (None: the request has no key).
ReceiptOf = Callable[[SessionMeta], Receipt | None]
Outcome = TypeVar("Outcome")
Made = TypeVar("Made")
# The record of a step's outcome (what its answer is made of).
OutcomeReceipt = Callable[[Outcome], Receipt | None]
# The response record of the version a turn commits, stored with it (sessions/responses.py).
ResponseOf = Callable[[SessionMeta], ResponseWrite | None]


def of_outcome(
    record: Callable[[Outcome], Made] | None, outcome: Callable[[SessionMeta], Outcome]
) -> Callable[[SessionMeta], Made] | None:
    """`record` (a receipt, a response record) of the outcome a committed version makes (None without one)."""
    if record is None:
        return None
    return lambda committed: record(outcome(committed))


# Settling a lost reply waits this long past the lease's TTL (Redis's and this process's clocks tick alike).
SETTLE_MARGIN_SECONDS = 1.0


def lease_lost() -> Conflict:
    return Conflict(
        "this step lost the session's lease (it could not renew it within TXL_LEASE_TTL_SECONDS, and another "
        "writer may have taken it): nothing was committed; retry",
        param="session_id",
        code="lease_lost",
    )


def session_limit(limit: int) -> InvalidRequest:
    return InvalidRequest(f"session limit reached ({limit}); delete some first", code="session_limit")


@contextlib.contextmanager
def released_on_failure(state: ModelState) -> Iterator[None]:
    """The caller's hold on `state` goes if the block fails (else it is handed on)."""
    try:
        yield
    except BaseException:
        state.release()
        raise


async def then_released(state: ModelState, step: Coroutine[Any, Any, T]) -> T:
    """`step`, then the hold on `state` its caller handed over goes, whatever happened: inside the work that runs
    to its end (`to_the_end`), so never while the step may still place the state."""
    with released(state):
        return await step


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


@dataclass(kw_only=True, eq=False)
class Steps:
    settings: Settings
    worker: Worker
    store: SessionStore
    leases: LeaseStore
    placement: Placement
    persistence: Persistence
    recovery: Recovery
    observer: SessionObserver
    holder: str  # this replica's id: the holder of every version it commits
    queues: RequestQueues = field(default_factory=RequestQueues, init=False)

    @contextlib.asynccontextmanager
    async def hold(
        self,
        owner: str,
        session_id: str,
        *,
        expected_version: int | None = None,
        check: Callable[[SessionMeta], None] | None = None,
        holding_response: str | None = None,
    ) -> AsyncIterator[tuple[SessionMeta, ModelState, Lease]]:
        """The owner's session for one step: its committed metadata, under its lease, and its state on the device
        (pinned there while the block runs). Before its state is fetched: Conflict (`version_moved`) if the
        session is not at `expected_version`, and `check` sees the metadata (what it raises ends the step).
        With `holding_response`, ResponseNotHeld if the session no longer holds that response."""
        async with contextlib.AsyncExitStack() as stack:
            since = span_start()
            try:  # the committed metadata, under the lease; 404 before 409 (a foreign session's state is private)
                wait = await stack.enter_async_context(self._first_in_line(owner, session_id))
                ttl = self.settings.lease_ttl_seconds
                step = self.leases.step(
                    session_id, owner, ttl, wait_seconds=wait(), holding_response=holding_response
                )
                meta, lease = await stack.enter_async_context(step)
            except Conflict:
                self.observer.on_conflict()
                raise
            except NotFound:
                raise await self.recovery.not_found(owner, session_id) from None
            session_held(owner, session_id, since=since)
            if meta.tier != "gone":  # 410 if Redis holds an older version than this process acknowledged
                await self.recovery.check_acked(meta)
            if expected_version is not None and meta.version != expected_version:
                moved = f"the session moved on from version {expected_version}"
                raise Conflict(moved, param="session_id", code="version_moved")
            if check is not None:
                check(meta)
            async with self._renewing(lease, None):  # reading it back may feed tokens again (write-behind)
                state = await self.placement.fetch(meta)  # this step's hold, released when it ends
            cache = self.placement.cache
            cache.pin(session_id)
            try:
                yield meta, state, lease
            finally:
                cache.unpin(session_id)
                state.release()

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
        receipt: ReceiptOf | None = None,
        prewrite: Prewrite | None = None,
        fed: list[int] | None = None,
        response: ResponseOf | None = None,
    ) -> SessionMeta:
        """Commits `state` as the version after `meta`'s, holding `tokens` tokens of text (`kind` and `text`: what
        the step was and what it added, for the versions list), with the Idempotency-Key's record `receipt`
        makes of the version. With persistence `always`, only the blocks the block store does not hold yet are
        written (those `prewrite` wrote while the step ran are not written again); a step that says which tokens
        it `fed` to `meta`'s state, few enough, commits ahead of its blocks, which are written after the answer
        (write-behind: persistence.py). `response` makes the turn's response record of the version, stored with
        it. `state` is the caller's hold, which this takes: released once committed
        or failed (the state cache keeps its own)."""
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
        durable: Durable[VersionWrite] | Durable[VersionWrite | Replay] | Durable[None]
        with released_on_failure(state):
            if fed is not None and prewrite is None and persistence.writes_behind(len(fed)):
                durable = persistence.ahead(state, summary, fed)
            elif persistence.always:
                early = await prewrite.result() if prewrite is not None else None
                durable = await persistence.prepare(state, summary, early=early)
            else:
                durable = persistence.unstored(state)
        commit_written(new.version, self.settings.persistence, durable.version)
        record = receipt(new) if receipt is not None else None
        stored_response = response(new) if response is not None else None
        # What Redis was sent (a Replay it refused is sent again with its blocks).
        written: list[VersionWrite | Replay | None] = []

        async def write(stored: VersionWrite | Replay | None) -> None:
            written.append(stored)
            sent = time.monotonic()
            try:
                # In "evict" mode an older stored version may sit in Redis: drop it with the commit, it is stale.
                committed = await self.store.commit(
                    new,
                    expected_version=meta.version,
                    lease=lease,
                    write=stored,
                    drop_stored=stored is None,
                    receipt=record,
                    response=stored_response,
                )
            except SessionGone:  # declared lost meanwhile (its holder looked dead): gone for every replica
                fresh = await self.store.get(meta.id)
                raise gone_error(fresh.gone if fresh is not None else Lost.CRASHED) from None
            except Fenced:
                raise lease_lost() from None
            except OutcomeUnknown:
                await self._settled(meta.id, "commit", lease, sent, meta.version)
                committed = True
            if not committed:
                raise NotFound(f"no session {meta.id!r}", param="session_id")
            lease.released = True  # handed back by the commit

        async def place(_: None) -> None:
            await self.placement.place(new, state, summary=summary)
            self.recovery.acked.note(new)
            if isinstance(written[-1], Replay):  # committed ahead of its blocks: they follow
                persistence.settle_later(new.id, summary, state.retain(), new.ttl_seconds)

        await to_the_end(then_released(state, durable.write_then_place(write, place)))
        return new

    async def create(
        self,
        meta: SessionMeta,
        state: ModelState,
        *,
        summary: VersionSummary,
        stored: bool,
        pin: bool = False,
        receipt: ReceiptOf | None = None,
        fed: list[int] | None = None,
    ) -> None:
        """Registers the new session `meta` (version 1) holding `state`: its id reserved under its owner's
        session limit, its metadata (and, if `stored`, its stored version) written to Redis with the
        Idempotency-Key's record `receipt` makes of it, then its state placed on the device (`pin`: and kept
        there until a step unpins it). A state an empty memory was `fed` (few enough tokens, persistence
        `always`) is stored ahead of its blocks, as those tokens; its blocks follow if `stored` (else the step
        that follows writes them with its own). `state` is the caller's hold, which this takes (as `commit`
        does)."""
        persistence = self.persistence
        durable: Durable[VersionWrite] | Durable[None]
        ahead = fed is not None and persistence.writes_behind(len(fed)) and len(fed) == state.fed
        with released_on_failure(state):
            if ahead and fed is not None:
                durable = persistence.first_ahead(state, summary, fed)
            elif stored:
                durable = await persistence.prepare(state, summary)
            else:
                durable = persistence.unstored(state)
        record = receipt(meta) if receipt is not None else None
        lease = Lease(meta.id, new_token(self.holder), self.settings.lease_ttl_seconds)

        async def write(stored: VersionWrite | None) -> None:
            sent = time.monotonic()
            try:
                await self.store.create(meta, stored, lease=lease, receipt=record)
            except Fenced:
                raise lease_lost() from None
            except OutcomeUnknown:
                await self._settled(meta.id, "commit", lease, sent, 0)

        async def place(_: None) -> None:
            await self.placement.place(meta, state, summary=summary)
            if pin:
                self.placement.cache.pin(meta.id)
            self.recovery.acked.note(meta)
            if ahead and stored:  # stored ahead of its blocks: they follow
                persistence.settle_later(meta.id, summary, state.retain(), meta.ttl_seconds)

        async def create() -> None:
            await self._reserve(meta, lease)
            await durable.write_then_place(write, place)

        await to_the_end(then_released(state, create()))

    async def _reserve(self, meta: SessionMeta, lease: Lease) -> None:
        """Reserves the new session's id under its owner's session limit (and takes its lease)."""
        limit = self.settings.max_sessions_per_tenant
        if await self.store.reserve(meta.owner, meta.id, limit=limit, lease=lease):
            return
        await self.store.list(meta.owner)  # prunes the index of expired sessions
        if not await self.store.reserve(meta.owner, meta.id, limit=limit, lease=lease):
            raise session_limit(limit)

    async def delete(self, meta: SessionMeta, *, receipt: Receipt | None = None) -> None:
        """Deletes the session under its lease (nobody steps it meanwhile), writing `receipt` with it."""
        async with self.exclusive(meta.owner, meta.id) as lease:

            async def delete() -> None:
                sent = time.monotonic()
                try:
                    await self.store.delete(meta, lease=lease, receipt=receipt)
                except Fenced:
                    raise lease_lost() from None
                except OutcomeUnknown:
                    await self._settled(meta.id, "delete", lease, sent, meta.version)
                lease.released = True
                self.recovery.acked.forget(meta.id)

            await to_the_end(delete())

    async def _settled(self, session_id: str, kind: str, lease: Lease, sent: float, version: int) -> None:
        """Waits for Redis to say whether a change whose reply was lost was applied (settling.py): returns if it
        was; raises Unavailable if it was not, OutcomeUnknown if Redis does not answer in time. Past the lease's
        TTL since the change was sent, Redis refuses a late arrival by itself: no need to wait longer."""
        self.observer.on_outcome_unknown()
        await settled(
            self.store,
            session_id,
            kind=kind,
            lease=lease,
            sent_at=sent,
            wait_seconds=lease.ttl_seconds + SETTLE_MARGIN_SECONDS,
            version=version,
        )

    async def run(
        self, job: Job, lease: Lease | None = None, *, progress: Progress | None = None
    ) -> AdvanceResult | GenerateResult:
        """The job's result; its progress events (an AdvanceJob's, with report_progress) go to `progress`."""

        def report(event: Any) -> None:
            if isinstance(event, ProgressEvent) and progress is not None:
                progress(event.done, event.total)

        if progress is not None and isinstance(job, AdvanceJob):
            progress(0, len(job.tokens))
        async with self._renewing(lease, job):
            result: AdvanceResult | GenerateResult = await job_result(self.worker, job, report)
        return result

    async def events(self, job: Job, lease: Lease | None) -> AsyncGenerator[Any, None]:
        """The job's events as the worker sends them, the lease kept meanwhile."""
        async with self._renewing(lease, job), contextlib.aclosing(run_job(self.worker, job)) as events:
            async for event in events:
                yield event

    @contextlib.asynccontextmanager
    async def _renewing(self, lease: Lease | None, job: Job | None) -> AsyncIterator[None]:
        """Keeps `lease` (if any) while the block runs: a long step outlives the lease's TTL. A renewal that finds
        the lease taken, or that cannot reach Redis until the lease would have expired, ends the step at once (its
        `job` ends with a 409 `lease_lost`; without one, its commit is refused the same way): a step that went on
        would only compute what its commit cannot keep."""

        async def keep(lease: Lease) -> None:
            renewed = time.monotonic()
            while True:
                await asyncio.sleep(lease.ttl_seconds / 3)
                try:
                    if not await self.leases.renew(lease):
                        break
                    renewed = time.monotonic()
                except Unavailable:  # Redis away for a moment: the lease may hold still
                    if time.monotonic() - renewed >= lease.ttl_seconds:
                        break
            self.observer.on_lease_lost()
            if job is not None:
                job.cancel(lease_lost())

        renewer = asyncio.create_task(keep(lease)) if lease is not None else None
        try:
            yield
        finally:
            if renewer is not None:
                renewer.cancel()
