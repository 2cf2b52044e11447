"""Sessions: the operations the API offers, on top of the worker (compute), the cache (tensors) and the store
(Redis metadata).

A step on a session runs under its single-writer lease and commits atomically: the new memory is computed on
the side, then the metadata is committed in Redis with a version check (and the snapshot, in persistence mode
`always`), and only then does the cache point to the new state. A step that fails, is cancelled or loses the
commit leaves the session exactly as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from txl import BlockPool, TransfoXLLMHeadModel, peak_positions
from txl.sampling import SamplingParams
from txl.tokenizers import Tokenizer
from txl.window import WindowRule

from ..engine.blocks import BlockIndex, legacy_state, restore, snapshot
from ..engine.jobs import (
    AdvanceJob,
    AdvanceResult,
    GenerateJob,
    GenerateResult,
    Job,
    ProgressEvent,
    TokenEvent,
    job_result,
    run_job,
)
from ..engine.state import ModelState, snapshot_metadata
from ..engine.worker import Worker
from ..errors import Conflict, Gone, InvalidRequest, NotFound, Overloaded, Unavailable
from ..settings import Persistence, Settings
from . import prefix_cache
from .cache import DEVICE, HOST, Entry, MemoryCache
from .history import SessionHistory
from .prefix_cache import PrefixCache
from .recovery import Lost, Replica, gone_error, held_elsewhere, settle
from .store import (
    BlocksMissing,
    Lease,
    MemoryWrite,
    SessionGone,
    SessionMeta,
    SessionStore,
    StoredMemory,
    VersionSummary,
    now,
)
from .turns import Turns

log = logging.getLogger(__name__)
T = TypeVar("T")
Progress = Callable[[int, int], None]  # (tokens_done, tokens_total)


class SessionObserver:
    """Hooks for metrics; the defaults do nothing."""

    def on_tier_move(self, source: str, target: str) -> None: ...

    def on_conflict(self) -> None: ...

    def on_tokens(self, kind: str, n: int) -> None: ...

    def on_prefix_cache(self, cached: int, total: int) -> None:
        """A prompt of `total` positions was read, `cached` of them from the prefix cache."""


@dataclass(frozen=True)
class AppendOutcome:
    session: SessionMeta
    tokens: int
    logprob: float


@dataclass(frozen=True)
class Released:
    """What a shutdown did with the sessions held in this process's memory."""

    saved: int  # written to Redis
    lost: int  # marked gone (persistence none, or no time left)


@dataclass(frozen=True)
class GenerateOutcome:
    session: SessionMeta
    result: GenerateResult


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


TEXT_TAIL_CHARS = 80  # of the text a step added, kept in the versions list


def version_summary(
    version: int, tokens: int, created_at: float, kind: str, text: str | None
) -> VersionSummary:
    return VersionSummary(version, tokens, created_at, kind, text[-TEXT_TAIL_CHARS:] if text else None)


def _after_start_token(progress: Progress | None, total: int) -> Progress | None:
    """Progress over a text's own tokens, for a job that feeds the start token before them."""
    if progress is None:
        return None
    return lambda done, _: progress(max(0, done - 1), total)


def new_session_id() -> str:
    """32 URL-safe characters holding ~192 random bits. Never starting with '-': command lines (ours included)
    would read such an id as an option, so those draws are discarded (which costs 0.02 bits); nor with `mem_`,
    which names preloaded memories (sessions/memories.py)."""
    while True:
        candidate = secrets.token_urlsafe(24)
        if not candidate.startswith(("-", "mem_")):
            return candidate


class SessionService:
    def __init__(
        self,
        *,
        settings: Settings,
        model: TransfoXLLMHeadModel,
        tokenizer: Tokenizer,
        worker: Worker,
        store: SessionStore,
        model_id: str,
        observer: SessionObserver | None = None,
        replica: Replica | None = None,
        exclusive: bool = False,
    ) -> None:
        self.settings = settings
        # Who this process is to other replicas (the holder of the sessions it commits), and whether it is the
        # only one using its Redis (a private Redis): see recovery.py.
        self.replica = replica or Replica.new(settings.port)
        self.exclusive = exclusive
        self.model = model
        self.tokenizer = tokenizer
        self.worker = worker
        self.store = store
        self.model_id = model_id
        self.observer = observer or SessionObserver()
        self.cache = MemoryCache(
            device_budget=settings.device_memory_bytes, host_budget=settings.host_memory_bytes
        )
        self.default_mem_len, self.max_mem_len = settings.mem_lens(model.config.mem_len)
        # A session starts with the tokenizer's separator (<eos> or "\n"), so its first real token is predicted
        # like any other: from the start of a document.
        self.start_id = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.encode("\n")[0]
        # The device's pool is the worker's; sessions moved off the device go to a pool of host memory, written
        # only under the tier lock.
        self.pool = worker.pool
        self.host_pool = BlockPool(
            self.pool.layout.on(device="cpu"),
            block_size=self.pool.block_size,
            keep_hidden=self.pool.keep_hidden,
        )
        self._tier_lock = asyncio.Lock()
        self._expiry: dict[str, float] = {}
        # Which pool blocks Redis already holds: a commit writes only the others (engine/blocks.py).
        self.index = BlockIndex()
        self.prefix_cache = PrefixCache(
            budget_bytes=settings.prefix_cache_budget, grid=worker.grid, salt=model_id
        )
        self.history = SessionHistory(self)
        from .memories import MemoryService  # it builds on this module

        self.memories = MemoryService(self)
        self._loop = asyncio.get_running_loop()
        self._relieving = False
        worker.on_pool_pressure = self._on_pool_pressure
        self.turns = Turns()

    # ------------------------------------------------------------------ reading

    async def get(self, owner: str, session_id: str) -> SessionMeta:
        """The owner's session, if it can be continued; 410 if its memory is lost (recovery.py)."""
        meta = await self._owned(owner, session_id)
        if meta.tier == "gone" or not await self._settle([meta]):
            gone = await self.store.get(session_id)
            raise gone_error(gone.gone if gone is not None else Lost.CRASHED)
        return meta

    async def _owned(self, owner: str, session_id: str) -> SessionMeta:
        meta = await self.store.get(session_id)
        if meta is None or not secrets.compare_digest(meta.owner, owner):
            raise NotFound(f"no session {session_id!r}", param="session_id")
        return meta

    async def list_sessions(self, owner: str) -> list[SessionMeta]:
        """The owner's sessions that can be continued: never one whose memory is lost."""
        return await self._settle(await self.store.list(owner))

    async def _settle(self, metas: list[SessionMeta]) -> list[SessionMeta]:
        return await settle(self.store, metas, me=self.replica, exclusive=self.exclusive)

    # ------------------------------------------------------------------ lifecycle

    async def create(
        self,
        owner: str,
        *,
        text: str = "",
        mem_len: int | None = None,
        ttl_seconds: int | None = None,
        metadata: dict[str, Any] | None = None,
        progress: Progress | None = None,
        memory: str | None = None,
    ) -> SessionMeta:
        """A new session that read `text`; `progress(tokens_done, tokens_total)` is called as the text is fed
        (first with 0, once the session is admitted). With `memory`, the preloaded memory's document first (its
        state shared: the cost does not depend on the document's length)."""
        if memory is not None:
            return await self.memories.start_session(
                owner,
                memory,
                text=text,
                mem_len=mem_len,
                ttl_seconds=ttl_seconds,
                metadata=metadata,
                progress=progress,
            )
        mem_len = self.default_mem_len if mem_len is None else mem_len
        if not 0 <= mem_len <= self.max_mem_len:
            raise InvalidRequest(f"mem_len must be between 0 and {self.max_mem_len}", param="mem_len")
        ttl = self._ttl(ttl_seconds)
        await self._admit_session(owner, mem_len)
        tokens = self.tokenizer.encode(text)
        empty = self.worker.empty_state(mem_len)
        ids = [self.start_id, *tokens]
        if progress is not None:
            progress(0, len(tokens))
        result = await prefix_cache.read(
            self.prefix_cache,
            self.worker,
            owner=owner,
            empty=empty,
            ids=ids,
            progress=_after_start_token(progress, len(tokens)),
        )
        meta = await self._register(
            owner, result.state, len(tokens), ttl, dict(metadata or {}), kind="create", text=text
        )
        self.observer.on_tokens("ingested", len(tokens) + 1)
        self.observer.on_prefix_cache(result.cached, len(ids))
        return meta

    async def _register(
        self,
        owner: str,
        state: ModelState,
        tokens: int,
        ttl: int,
        metadata: dict[str, Any],
        *,
        kind: str,
        text: str | None = None,
    ) -> SessionMeta:
        """A new session at version 1 holding `state`: metadata (and its stored version) to Redis, memory to the
        device."""
        stamp = now()
        meta = SessionMeta(
            id=new_session_id(),
            owner=owner,
            created_at=stamp,
            last_used=stamp,
            ttl_seconds=ttl,
            mem_len=state.mem_len,
            model=self.model_id,
            tokens=tokens,
            mem_tokens=state.memory.length,
            version=1,
            holder=self.replica.id,
            metadata=metadata,
        )
        summary = version_summary(1, tokens, stamp, kind, text)
        write = await self._memory_write(state, summary) if self._persist_always else None

        async def register() -> None:
            if write is None:
                await self.store.create(meta)
            else:
                await self._stored(lambda w: self.store.create(meta, w), write, state)
            await self._place(meta, state, summary=summary)

        await to_the_end(register())
        return meta

    async def _admit_session(self, owner: str, mem_len: int) -> None:
        """The checks every new session passes (create, fork, import): the owner's session limit, and room for
        its memory on the device."""
        await self._check_session_limit(owner)
        self._admit(mem_len)

    async def _check_session_limit(self, owner: str) -> None:
        limit = self.settings.max_sessions_per_tenant
        # The index may still list expired sessions: count exactly (and prune) only when it matters.
        if await self.store.count(owner) >= limit and await self.store.count_exact(owner) >= limit:
            raise InvalidRequest(f"session limit reached ({limit}); delete some first")

    async def delete(self, owner: str, session_id: str) -> None:
        meta = await self._owned(owner, session_id)  # a gone session too: its owner may tidy up
        async with contextlib.AsyncExitStack() as stack:
            wait = await stack.enter_async_context(self._turn(owner, session_id))
            await stack.enter_async_context(
                self.store.lease(session_id, self.settings.lease_ttl_seconds, wait_seconds=wait())
            )
            await self.store.delete(meta)
        self.cache.drop(session_id)
        self._expiry.pop(session_id, None)

    async def fork(
        self,
        owner: str,
        session_id: str,
        *,
        metadata: dict[str, Any] | None = None,
        version: int | None = None,
    ) -> SessionMeta:
        """A new session with the same memory as the session's newest version, or as `version` (its blocks
        shared: a fork costs a table, not a copy)."""
        meta = await self.get(owner, session_id)
        await self._admit_session(owner, meta.mem_len)
        if version is None or version == meta.version:
            state, tokens = await self._state(meta), meta.tokens
        else:
            state, summary = await self.history.state_at(meta, version)
            tokens = summary.tokens
        child_metadata = dict(meta.metadata if metadata is None else metadata)
        return await self._register(owner, state, tokens, meta.ttl_seconds, child_metadata, kind="fork")

    # ------------------------------------------------------------------ moving sessions between deployments

    async def export_snapshot(self, owner: str, session_id: str) -> bytes:
        """The session as one safetensors blob: its memory, and its metadata in the header."""
        meta = await self.get(owner, session_id)
        state = await self._state(meta)
        extra = {
            "txl_snapshot": "1",
            "model": meta.model,
            "tokens": str(meta.tokens),
            "version": str(meta.version),
            "metadata": json.dumps(meta.metadata),
        }
        return await asyncio.to_thread(state.to_bytes, extra)

    async def import_snapshot(
        self, owner: str, data: bytes, *, ttl_seconds: int | None = None
    ) -> SessionMeta:
        """A new session (new id, this owner) holding an exported session's memory."""
        try:
            header = snapshot_metadata(data)
            tokens = int(header["tokens"])
            metadata = json.loads(header.get("metadata", "{}"))
            if header.get("txl_snapshot") != "1" or tokens < 0 or not isinstance(metadata, dict):
                raise ValueError("missing or malformed session fields")
        except (ValueError, KeyError) as exc:
            raise InvalidRequest(
                "the body is not a session snapshot (export one with GET /v1/sessions/{id}/snapshot)",
                param="body",
            ) from exc
        try:
            state = await self._load(data)
        except ValueError as exc:
            raise InvalidRequest(
                "the snapshot does not fit this server's model (it was exported from another model, or damaged)",
                param="body",
            ) from exc
        if state.mem_len > self.max_mem_len:
            raise InvalidRequest(
                f"the snapshot's mem_len exceeds this server's {self.max_mem_len}", param="body"
            )
        if any(not 0 <= t < self.tokenizer.vocab_size for t in state.tail):
            raise InvalidRequest("the snapshot's token ids do not fit this model's vocabulary", param="body")
        await self._admit_session(owner, state.mem_len)
        return await self._register(owner, state, tokens, self._ttl(ttl_seconds), metadata, kind="import")

    # ------------------------------------------------------------------ steps

    async def append(
        self, owner: str, session_id: str, text: str, *, progress: Progress | None = None
    ) -> AppendOutcome:
        """Feeds `text`; `progress(tokens_done, tokens_total)` is called as it is fed (first with 0, once the step
        holds the session)."""
        tokens = self.tokenizer.encode(text)
        async with self._step(owner, session_id) as (meta, state, lease):
            job = AdvanceJob(state, tokens, report_progress=progress is not None)
            result = await self._run(job, lease, progress=progress)
            assert isinstance(result, AdvanceResult)
            committed = await self._commit(
                meta, result.state, meta.tokens + len(tokens), lease=lease, kind="append", text=text
            )
        self.observer.on_tokens("ingested", len(tokens))
        return AppendOutcome(committed, len(tokens), result.logprob)

    async def generate(
        self,
        owner: str,
        session_id: str,
        *,
        text: str = "",
        prompt_tokens: list[int] | None = None,
        max_tokens: int,
        sampling: SamplingParams,
        stop: list[str] | None = None,
        top_logprobs: int = 0,
        report_progress: bool = False,
        expected_version: int | None = None,
    ) -> AsyncGenerator[TokenEvent | ProgressEvent | GenerateOutcome, None]:
        """Yields a TokenEvent per sampled token (with the `top_logprobs` likeliest alternatives, if asked),
        then the GenerateOutcome (after the commit). With `report_progress`, a text longer than one segment
        first yields a ProgressEvent per segment fed (a long prompt takes a while before the first token).

        Closing the iterator early (a client that went away) cancels the generation: nothing is committed.
        `prompt_tokens`, when the caller has already encoded `text` (or was given token ids), are used as they
        are: a request's text is encoded once. With `expected_version`, the step runs only if the session is at
        that version when its lease is taken (else Conflict, code `version_moved`, before any event).
        """
        if not 0 <= max_tokens <= self.settings.max_tokens:
            raise InvalidRequest(
                f"max_tokens must be between 0 and {self.settings.max_tokens}", param="max_tokens"
            )
        prompt = self.tokenizer.encode(text) if prompt_tokens is None else list(prompt_tokens)
        async with self._step(owner, session_id) as (meta, state, lease):
            if expected_version is not None and meta.version != expected_version:
                raise Conflict(
                    f"the session moved on from version {expected_version}",
                    param="session_id",
                    code="version_moved",
                )
            if state.last_hidden is None and not prompt:  # pragma: no cover - sessions always start primed
                raise InvalidRequest("nothing to continue from: give text", param="text")
            start, to_feed = state, prompt
            if report_progress and len(prompt) > self.segment_len:
                # Fed as a job of its own, which the worker reports segment by segment; decoding then starts
                # from the state the generation's own prompt ingestion would have reached.
                fed = AdvanceJob(state, prompt, report_progress=True)
                async with contextlib.aclosing(self._events(fed, lease)) as events:
                    async for event in events:
                        if isinstance(event, ProgressEvent):
                            yield event
                        elif isinstance(event, AdvanceResult):
                            start, to_feed = event.state, []
            job = GenerateJob(
                start, to_feed, max_tokens, sampling, list(stop or []), top_logprobs=top_logprobs
            )
            result: GenerateResult | None = None
            async with contextlib.aclosing(self._events(job, lease)) as events:
                async for event in events:
                    if isinstance(event, TokenEvent):
                        yield event
                    elif isinstance(event, GenerateResult):
                        result = dataclasses.replace(event, prompt_tokens=len(prompt))
            assert result is not None
            committed = await self._commit(
                meta,
                result.state,
                meta.tokens + len(prompt) + result.completion_tokens,
                lease=lease,
                kind="generate",
                text=text + result.text,
            )
        self.observer.on_tokens("ingested", len(prompt))
        self.observer.on_tokens("generated", result.completion_tokens)
        yield GenerateOutcome(committed, result)

    # ------------------------------------------------------------------ step machinery

    @contextlib.asynccontextmanager
    async def _step(
        self, owner: str, session_id: str
    ) -> AsyncIterator[tuple[SessionMeta, ModelState, Lease]]:
        async with contextlib.AsyncExitStack() as stack:
            try:  # the committed metadata, under the lease; 404 before 409 (a foreign session's state is private)
                wait = await stack.enter_async_context(self._turn(owner, session_id))
                meta, lease = await stack.enter_async_context(
                    self.store.step(session_id, owner, self.settings.lease_ttl_seconds, wait_seconds=wait())
                )
            except Conflict:
                self.observer.on_conflict()
                raise
            state = await self._state(meta)
            self.cache.pin(session_id)
            try:
                yield meta, state, lease
            finally:
                self.cache.unpin(session_id)

    @contextlib.asynccontextmanager
    async def _turn(self, owner: str, session_id: str) -> AsyncIterator[Callable[[], float]]:
        """This request's turn among this process's requests on the session (waiting for those before it),
        yielding how much of `lease_wait_seconds` is left to wait for a writer elsewhere."""
        deadline = time.monotonic() + self.settings.lease_wait_seconds
        async with self.turns.take(owner, session_id, wait_seconds=self.settings.lease_wait_seconds):
            yield lambda: max(0.0, deadline - time.monotonic())

    async def _commit(
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
            holder=self.replica.id,
        )
        summary = version_summary(new.version, new.tokens, new.last_used, kind, text)
        write_memory = await self._memory_write(state, summary) if self._persist_always else None

        async def commit() -> None:
            try:
                await write()
            except SessionGone:  # declared lost meanwhile (its holder looked dead): gone for every replica
                fresh = await self.store.get(meta.id)
                raise gone_error(fresh.gone if fresh is not None else Lost.CRASHED) from None
            await self._place(new, state, summary=summary)

        async def write() -> None:
            if write_memory is None:
                # In "evict" mode an older stored memory may sit in Redis: drop it with the commit, it is stale.
                committed = await self.store.commit(
                    new, expected_version=meta.version, drop_memory=True, lease=lease
                )
            else:
                committed = await self._stored(
                    lambda w: self.store.commit(new, expected_version=meta.version, write=w, lease=lease),
                    write_memory,
                    state,
                )
            if not committed:
                raise NotFound(f"no session {meta.id!r}", param="session_id")

        await to_the_end(commit())
        return new

    async def _run(
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

    async def _events(self, job: Job, lease: Lease | None) -> AsyncGenerator[Any, None]:
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
                    await lease.renew()

        renewer = asyncio.create_task(keep(lease)) if lease is not None else None
        try:
            yield
        finally:
            if renewer is not None:
                renewer.cancel()

    # ------------------------------------------------------------------ memory tiers

    @property
    def _persist_always(self) -> bool:
        return self.settings.persistence is Persistence.ALWAYS

    async def _memory_write(
        self, state: ModelState, summary: VersionSummary, *, full: bool = False
    ) -> MemoryWrite:
        """The state as a version to store: the blocks Redis does not hold yet (all with `full`), read off the
        loop."""
        stored = await asyncio.to_thread(snapshot, state, self.index, full=full)
        return MemoryWrite(stored, summary, self.settings.keep_versions)

    async def _stored(
        self, call: Callable[[MemoryWrite], Awaitable[T]], write: MemoryWrite, state: ModelState
    ) -> T:
        """Runs a store write; if Redis lacks blocks the index thought it held (they expired), writes every block
        again. The index then learns the blocks written."""
        try:
            result = await call(write)
        except BlocksMissing as exc:
            self.index.forget(exc.ids)
            write = await self._memory_write(state, write.summary, full=True)
            result = await call(write)
        self.index.learn(write.stored.learned)
        return result

    async def _state(self, meta: SessionMeta) -> ModelState:
        """The session's memory at its committed version, brought to the device tier."""
        if meta.tier == "gone":
            self.cache.drop(meta.id)
            raise gone_error(meta.gone)
        entry = self.cache.get(meta.id)
        if entry is not None and entry.version == meta.version:
            if entry.tier == HOST:
                # Writing the device's pool is the worker's: between its iterations.
                moved = await self.worker.call(lambda: entry.state.moved(self.pool))
                await self._place(meta, moved, source=HOST)
                return moved
            return entry.state
        if entry is not None:  # a stale copy (another replica committed since): never served
            self.cache.drop(meta.id)
        try:
            stored = await self.store.load_memory(meta.id)
        except BlocksMissing as exc:
            raise Gone("this session's stored memory has expired", param="session_id") from exc
        if stored is None or stored.version != meta.version:
            raise await self._missing(meta)
        try:
            state = await self._restore(stored)
        except ValueError as exc:
            raise Gone(
                "this session's stored memory does not fit the loaded model", param="session_id"
            ) from exc
        await self._place(meta, state, source="redis")
        return state

    async def _missing(self, meta: SessionMeta) -> Gone | Unavailable:
        """Why a session's memory at its version is neither here nor in Redis."""
        elsewhere = meta.holder and meta.holder != self.replica.id and not self.exclusive
        if elsewhere and meta.holder in await self.store.live_replicas([meta.holder]):
            return held_elsewhere()
        if meta.holder != self.replica.id:  # this process never had it: its holder died without saving it
            await self.store.mark_gone(meta, Lost.CRASHED)
        return gone_error(Lost.CRASHED)

    async def _load(self, data: bytes) -> ModelState:
        """An exported snapshot's state, in the device's pool (written on the worker thread)."""
        layout = self.model.memory_layout()
        same_length, grid = self.model.config.same_length, self.worker.grid
        return await self.worker.call(
            lambda: ModelState.from_bytes(data, layout, self.pool, grid=grid, same_length=same_length)
        )

    async def _restore(self, stored: StoredMemory) -> ModelState:
        """A memory read back from Redis, in the device's pool (written on the worker thread)."""
        if stored.legacy is not None:
            return await self._load(stored.legacy)
        assert stored.header is not None
        header, hidden = stored.header, stored.hidden
        layout, pool, grid, index = self.model.memory_layout(), self.pool, self.worker.grid, self.index
        if stored.legacy_blocks:
            blocks = stored.legacy_blocks
            return await self.worker.call(
                lambda: legacy_state(header, hidden, blocks, layout, pool, grid=grid)
            )
        data = stored.blocks
        return await self.worker.call(lambda: restore(header, hidden, data, layout, pool, index, grid=grid))

    def _admit(self, mem_len: int) -> None:
        """Refuses a session that could never run: its memory at its largest (full, with the room segment by
        segment ingestion keeps) does not fit the device budget."""
        per_position = self.model.memory_layout().bytes_per_position()
        held = WindowRule(mem_len, self.model.config.same_length, self.worker.grid).max_positions
        needed = peak_positions(held, self.segment_len) * per_position
        if needed > self.cache.budget(DEVICE):
            raise Overloaded(
                f"a session with mem_len {mem_len} needs {needed} bytes, more than the device budget allows",
                retry_after=60,
            )
        if self.cache.pinned_bytes() + needed > self.cache.budget(DEVICE):
            raise Overloaded("no room for another session right now; retry shortly", retry_after=1)

    @property
    def segment_len(self) -> int:
        return self.worker.segment_len

    async def _place(
        self,
        meta: SessionMeta,
        state: ModelState,
        *,
        source: str | None = None,
        summary: VersionSummary | None = None,
    ) -> None:
        """Puts a session's state on the device tier, first moving least recently used sessions down (device ->
        host -> Redis or gone) so that no tier goes over its budget, even for a moment. A new version
        (`summary`) keeps the versions before it that the device holds, up to TXL_KEEP_VERSIONS."""
        keep = max(1, self.settings.keep_versions)
        async with self._tier_lock:
            previous = self.cache.drop(meta.id)  # its previous state's bytes are free now
            older: dict[int, ModelState] = {}
            summaries = list(previous.summaries) if previous is not None else []
            if summary is not None:
                if previous is not None and previous.version == meta.version - 1:
                    older = dict(previous.older)
                    if previous.tier == DEVICE:
                        older[previous.version] = previous.state
                else:
                    summaries = []
                summaries = [*summaries, summary][-keep:]
            kept = {s.version for s in summaries}
            older = {v: s for v, s in older.items() if v in kept}
            await self._make_room(DEVICE, self.cache.added_bytes(DEVICE, state, *older.values()))
            self.cache.put(meta.id, state, meta.version, DEVICE, older=older, summaries=summaries)
            self._expiry[meta.id] = meta.expires_at
        if source is not None:
            self.observer.on_tier_move(source, DEVICE)
            await self._set_tier(meta.id, DEVICE)

    async def _make_room(self, tier: str, needed: int) -> None:
        """Moves victims out of `tier` until `needed` more bytes fit (or nothing else can move). Holds the lock."""
        while self.cache.used(tier) + needed > self.cache.budget(tier):
            if self.cache.drop_older(tier):  # older versions go before any session's newest
                continue
            victim = self.cache.victim(tier)
            if victim is None:
                return
            await self._move_down(victim, tier)

    async def _move_down(self, victim: str, tier: str) -> None:
        """Moves one session out of `tier`: from the device to the host if the host has room, else out of this
        process. Holds the lock."""
        entry = self.cache.peek(victim)
        assert entry is not None
        if tier == DEVICE:
            moved = await asyncio.to_thread(entry.state.moved, self.host_pool)
            host_needs = self.cache.added_bytes(HOST, moved)
            await self._make_room(HOST, host_needs)
            if self.cache.peek(victim) is not entry:  # changed while we copied: the caller looks again
                return
            if self.cache.used(HOST) + host_needs <= self.cache.budget(HOST):
                self.cache.replace(victim, moved, HOST)
                self.observer.on_tier_move(DEVICE, HOST)
                await self._set_tier(victim, HOST)
                return
        await self._spill(victim, entry)

    def _on_pool_pressure(self, blocks: int) -> None:
        """The worker (on its thread) lacks `blocks` free blocks of a pool that never grows: idle sessions leave
        the device until it has them (one relief at a time)."""
        if not self._relieving:
            self._relieving = True
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._relieve_pool(blocks)))

    async def _relieve_pool(self, blocks: int) -> None:
        try:
            async with self._tier_lock:
                while self.pool.available_blocks < blocks:
                    if self.prefix_cache.evict_one() or self.cache.drop_older(DEVICE):
                        continue
                    victim = self.cache.victim(DEVICE)
                    if victim is None:
                        return
                    await self._move_down(victim, DEVICE)
        except Exception as exc:  # Redis away while spilling: the worker asks again
            log.warning("could not move sessions off the device: %s", exc)
        finally:
            self._relieving = False

    async def _spill(self, victim: str, entry: Entry, *, lost: Lost = Lost.EVICTED) -> None:
        """Out of this process: to Redis (persistence on), else dropped: the session is marked gone for `lost`
        (it answers 410 saying so, and is no longer listed)."""
        target = "gone"
        if self.settings.persistence is not Persistence.NONE:
            if not self._persist_always:  # "always" already wrote this version at commit
                meta = await self.store.get(victim)
                if meta is not None and meta.version == entry.version and meta.tier != "gone":
                    summary = (
                        entry.summaries[-1]
                        if entry.summaries
                        else version_summary(meta.version, meta.tokens, meta.last_used, "append", None)
                    )
                    write = await self._memory_write(entry.state, summary)
                    await self._stored(
                        lambda w: self.store.save_memory(victim, entry.version, w, meta.ttl_seconds),
                        write,
                        entry.state,
                    )
            target = "redis"
        if self.cache.peek(victim) is entry:
            self.cache.drop(victim)
            self.observer.on_tier_move(entry.tier, target)
            if target == "gone":
                await self._mark_gone(victim, entry.version, lost)
            else:
                await self._set_tier(victim, target)

    async def _mark_gone(self, session_id: str, version: int, lost: Lost) -> None:
        with contextlib.suppress(Exception):  # Redis away: start-up reconciliation will find it
            meta = await self.store.get(session_id)
            if meta is not None and meta.version == version:
                await self.store.mark_gone(meta, lost)

    async def _set_tier(self, session_id: str, tier: str) -> None:
        with contextlib.suppress(Exception):  # bookkeeping only: a session's truth is its version
            await self.store.touch_tier(session_id, tier)

    async def release_all(self, deadline: float) -> Released:
        """At shutdown: the sessions whose memory only this process holds are saved to Redis (persistence
        `evict`), most recently used first, until `deadline` (time.monotonic()); those left, and all of them
        with persistence `none`, are marked gone with the reason. With `always` Redis holds them already."""
        saved = marked = 0
        if self._persist_always:
            return Released(saved=0, lost=0)
        async with self._tier_lock:
            for session_id in self.cache.most_recent_first():
                entry = self.cache.peek(session_id)
                if entry is None:
                    continue
                if self.settings.persistence is Persistence.NONE:
                    lost: Lost | None = Lost.RESTARTED
                elif time.monotonic() >= deadline:
                    lost = Lost.UNSAVED
                else:
                    lost = None
                try:
                    if lost is None:
                        await self._spill(session_id, entry)
                        saved += 1
                    else:
                        self.cache.drop(session_id)
                        await self._mark_gone(session_id, entry.version, lost)
                        marked += 1
                except Exception as exc:  # Redis away: start-up reconciliation marks what is lost
                    log.warning("could not save session memory at shutdown: %s", exc)
        return Released(saved=saved, lost=marked)

    async def reap_expired(self) -> int:
        """Frees the memory of sessions whose TTL ran out (Redis already dropped their metadata)."""
        stamp = now()
        freed = 0
        for session_id, expires_at in list(self._expiry.items()):
            if expires_at > stamp:
                continue
            meta = await self.store.get(session_id)
            if meta is None:
                self.cache.drop(session_id)
                self._expiry.pop(session_id, None)
                freed += 1
            else:
                self._expiry[session_id] = meta.expires_at
        return freed

    def _ttl(self, ttl_seconds: int | None) -> int:
        ttl = self.settings.default_ttl_seconds if ttl_seconds is None else ttl_seconds
        if not 1 <= ttl <= self.settings.max_ttl_seconds:
            raise InvalidRequest(
                f"ttl_seconds must be between 1 and {self.settings.max_ttl_seconds}", param="ttl_seconds"
            )
        return ttl
