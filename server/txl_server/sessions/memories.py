"""Preloaded memories: read a document once, start any number of sessions from it.

A Transformer-XL memory has a fixed size whatever it has read, and a session's state is a function of its tokens
(txl.window): so "the model has read this document" is one small state, and a session started from it is that
state's block table, shared (no copy, no recompute), continuing exactly like a session that read the document
itself. Scoring and completions can start from it too ("as if the document came first").

Where a memory lives:
- Redis, always, whatever the sessions' persistence mode (store/memories.py): metadata, and its state as one stored
  version listing blocks. A session started from it lists the same blocks in its own versions (persistence
  `always` at once, `evict` when it leaves the device): Redis holds each block once, counted per listing.
- This process: its state in the state cache's tiers under its id, like a session, counted once with
  every session sharing its blocks. Read from Redis on first use on each replica (once, however many requests
  ask at the same moment), then shared; pinned while a request uses it. A memory moved off the device is read
  back from Redis, which always holds it.

Deleting a memory takes only its own references away: pool blocks are held by every state listing them, Redis
blocks by every stored version listing them, so sessions started from it never notice.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from txl.tokenizers import Tokenizer

from ..admission.classes import RequestClass
from ..engine.jobs import AdvanceJob, AdvanceResult, Event, ProgressEvent, job_result
from ..engine.state import ModelState, released
from ..engine.worker import Worker
from ..errors import Gone, InvalidRequest, NotFound
from ..settings import Settings
from .admission import Admission
from .observer import SessionObserver
from .persistence import Persistence
from .placement import Placement
from .prefix_cache import PromptReader
from .state_cache import DEVICE
from .stateless import PromptScores, ScoreOutcome
from .step import released_on_failure, then_released, to_the_end
from .store.memories import MemoryMeta, MemoryStore, new_memory_id
from .store.plumbing import now
from .store.versions import BlocksMissing, VersionSummary, VersionWrite

ProgressCallback = Callable[[int, int], None]

MAX_NAME_CHARS = 128


@dataclass(kw_only=True, eq=False)
class MemoryService:
    settings: Settings
    tokenizer: Tokenizer
    worker: Worker
    store: MemoryStore
    prompts: PromptReader
    admission: Admission
    placement: Placement
    persistence: Persistence
    observer: SessionObserver
    model_id: str
    mem_len: int  # every memory is read with the server's default
    _loading: dict[str, asyncio.Future[ModelState]] = field(default_factory=dict, init=False)
    # Requests using each memory now: pinned while any does.
    _users: Counter[str] = field(default_factory=Counter, init=False)

    # ------------------------------------------------------------------ the memories themselves

    async def create(
        self,
        owner: str,
        text: str,
        *,
        name: str | None = None,
        ttl_seconds: int | None = None,
        metadata: dict[str, Any] | None = None,
        progress: ProgressCallback | None = None,
    ) -> MemoryMeta:
        """Reads `text` into a new memory, reporting `progress(tokens_done, tokens_total)` segment by segment.
        Cancelled (its awaiting task cancelled: the client left) before its commit, it leaves nothing behind."""
        check_name(name)
        ttl = self.admission.ttl(ttl_seconds)
        tokens = self.tokenizer.encode(text)
        if not tokens:
            raise InvalidRequest("the memory's text is empty", param="text")
        await self._check_limit(owner)
        mem_len = self.mem_len
        self.admission.fits(mem_len)
        # Not through the prefix cache: the memory keeps the state it reaches, and sessions start from that.
        read = await self.prompts.read(owner, tokens, mem_len=mem_len, progress=progress, through_cache=False)
        state = read.state  # this call's hold, released once placed (the state cache keeps its own) or failed
        stamp = now()
        meta = MemoryMeta(
            id=new_memory_id(),
            owner=owner,
            name=name,
            created_at=stamp,
            updated_at=stamp,
            expires_at=stamp + ttl,
            tokens=len(tokens),
            bytes=len(text.encode("utf-8", "surrogatepass")),
            mem_tokens=state.memory.length,
            mem_len=mem_len,
            model=self.model_id,
            metadata=dict(metadata or {}),
        )
        summary = VersionSummary.of(1, meta.tokens, meta.created_at, "create", text)
        with released_on_failure(state):
            durable = await self.persistence.prepare(state, summary, full=True)

        async def write(stored: VersionWrite) -> None:
            await self.store.create(meta, stored)

        async def place(_: None) -> None:
            await self.placement.place_memory(meta.id, state, meta.expires_at)

        await to_the_end(then_released(state, durable.write_then_place(write, place)))
        self.observer.on_tokens("ingested", len(tokens) + 1)
        return meta

    async def _check_limit(self, owner: str) -> None:
        limit = self.settings.max_memories_per_tenant
        # The index may still list expired memories: count exactly (and prune) only when it matters.
        if await self.store.count(owner) >= limit and len(await self.store.list(owner)) >= limit:
            raise InvalidRequest(f"memory limit reached ({limit}); delete some first")

    async def get(self, owner: str, memory_id: str) -> MemoryMeta:
        meta = await self.store.get(memory_id) if _plausible(memory_id) else None
        if meta is None or not secrets.compare_digest(meta.owner, owner):
            if meta is None:
                self.placement.forget(memory_id)
            raise NotFound(f"no memory {memory_id!r}", param="memory")
        return meta

    async def list(self, owner: str) -> builtins.list[MemoryMeta]:
        return await self.store.list(owner)

    async def update(
        self,
        owner: str,
        memory_id: str,
        *,
        ttl_seconds: int | None = None,
        changes: dict[str, Any],
    ) -> MemoryMeta:
        """Sets `changes` (name, metadata) and, with `ttl_seconds`, a new expiry that many seconds from now."""
        meta = await self.get(owner, memory_id)
        if "name" in changes:
            check_name(changes["name"])
        stamp = now()
        updated = dataclasses.replace(meta, updated_at=stamp, **changes)
        if ttl_seconds is not None:
            updated.expires_at = stamp + self.admission.ttl(ttl_seconds)
        if not await self.store.update(updated):
            raise NotFound(f"no memory {memory_id!r}", param="memory")
        self.placement.extend(memory_id, updated.expires_at)
        return updated

    async def delete(self, owner: str, memory_id: str) -> None:
        """Deletes the memory. This process's copy goes (the sessions sharing its blocks keep them, and so do
        requests using it now: they hold its state)."""
        if not _plausible(memory_id) or not await self.store.delete(owner, memory_id):
            raise NotFound(f"no memory {memory_id!r}", param="memory")
        self.placement.forget(memory_id)

    # ------------------------------------------------------------------ reading from a memory

    async def score(
        self,
        owner: str,
        memory_id: str,
        text: str,
        *,
        token_logprobs: bool = False,
        progress: ProgressCallback | None = None,
        klass: RequestClass | None = None,
    ) -> ScoreOutcome:
        """log p(text | the memory's document), as /v1/score reports it."""
        tokens = self.tokenizer.encode(text)
        if not tokens:
            raise InvalidRequest("text to score is empty", param="text")

        def report(event: Event) -> None:
            if isinstance(event, ProgressEvent) and progress is not None:
                progress(event.done, len(tokens))

        async with self.using(owner, memory_id) as (_, state):
            job = AdvanceJob(state, tokens, token_logprobs=token_logprobs, report_progress=True, klass=klass)
            result: AdvanceResult = await job_result(self.worker, job, report)
        result.state.release()  # nothing is kept
        self.observer.on_tokens("scored", len(tokens))
        return ScoreOutcome(
            len(tokens),
            len(text.encode("utf-8", "surrogatepass")),
            result.logprob,
            result.token_logprobs,
            tokens,
            result.state.nbytes,
        )

    async def prefill(
        self,
        owner: str,
        memory_id: str,
        tokens: builtins.list[int],
        *,
        logprobs: bool,
        top_logprobs: int,
        klass: RequestClass | None = None,
    ) -> tuple[ModelState, PromptScores]:
        """Feeds a prompt after the memory (nothing is stored); with `logprobs`, scores every prompt token given
        the document and the tokens before it. What stateless completions (and /v1/responses) start from when a
        request names a memory: the caller's state, which it releases when done."""
        async with self.using(owner, memory_id) as (_, state):
            job = AdvanceJob(state, tokens, token_logprobs=logprobs, top_logprobs=top_logprobs, klass=klass)
            result: AdvanceResult = await job_result(self.worker, job)
        self.observer.on_tokens("ingested", len(tokens))
        return result.state, PromptScores(tokens, list(result.token_logprobs or []), result.token_top)

    @contextlib.asynccontextmanager
    async def using(self, owner: str, memory_id: str) -> AsyncIterator[tuple[MemoryMeta, ModelState]]:
        """The owner's memory and its state on the device, pinned there while the block runs (sessions start from
        it here: SessionService.create)."""
        meta = await self.get(owner, memory_id)
        cache = self.placement.cache
        self._users[memory_id] += 1
        cache.pin(memory_id)
        try:
            yield meta, await self._state(meta)
        finally:
            self._users[memory_id] -= 1
            if self._users[memory_id] <= 0:
                del self._users[memory_id]
                cache.unpin(memory_id)

    async def _state(self, meta: MemoryMeta) -> ModelState:
        entry = self.placement.cache.get(meta.id)
        if entry is not None and entry.tier == DEVICE:
            return entry.state
        loading = self._loading.get(meta.id)
        if loading is None:
            loading = asyncio.ensure_future(self._load(meta))
            self._loading[meta.id] = loading
            loading.add_done_callback(lambda _: self._loading.pop(meta.id, None))
        return await asyncio.shield(loading)

    async def _load(self, meta: MemoryMeta) -> ModelState:
        """The memory's state read from Redis onto the device (the index learns that Redis holds its blocks, so
        sessions started from it list them instead of writing them again)."""
        try:
            stored = await self.store.load(meta.id)
        except BlocksMissing as exc:
            raise Gone("this memory's stored state has expired", param="memory") from exc
        if stored is None:
            raise NotFound(f"no memory {meta.id!r}", param="memory")
        try:
            state = await self.persistence.restore(stored)
        except ValueError as exc:
            raise Gone("this memory's stored state does not fit the loaded model", param="memory") from exc
        with released(state):  # the cache holds it: what is returned reads through the cache's hold
            await self.placement.place_memory(meta.id, state, meta.expires_at)
        return state


def check_name(name: str | None) -> None:
    if name is not None and len(name) > MAX_NAME_CHARS:
        raise InvalidRequest(f"name is longer than {MAX_NAME_CHARS} characters", param="name")


def _plausible(memory_id: str) -> bool:
    """Ids this server made: `mem_` then URL-safe characters (anything else is no key to look up)."""
    return memory_id.startswith("mem_") and 4 < len(memory_id) <= 64 and "/" not in memory_id
