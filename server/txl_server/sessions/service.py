"""Sessions: the operations the API offers, on top of the worker (compute), the state cache (tensors) and the
stores (Redis).

The service is an orchestrator over parts with public interfaces, each in a module of its own:
    step.py         the atomic versioned step: queue, lease, commit, lease renewal
    placement.py    where each state lives (device, host, Redis, or lost), within the tiers' budgets
    persistence.py  states to Redis and back (versions), and to snapshots and back
    admission.py    the checks a new session passes (TTL, the owner's limit, room on the device)
    recovery.py     which sessions can be continued (a replica holding them, or Redis)
    history.py      the versions a session keeps, rewinding to one
    memories.py     preloaded memories, which sessions start from (here: `create`)
A new session is registered here at version 1; every later version is a step's commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from txl import TransfoXLLMHeadModel
from txl.sampling import SamplingParams
from txl.tokenizers import Tokenizer

from ..admission.classes import RequestClass
from ..engine.jobs import (
    AdvanceJob,
    AdvanceResult,
    GenerateJob,
    GenerateResult,
    ProgressEvent,
    PromptFed,
    TokenEvent,
)
from ..engine.state import ModelState, released
from ..engine.worker import Worker
from ..errors import InvalidRequest
from ..limits import check_max_tokens
from ..memory_budgets import MemoryBudgets
from ..settings import Settings
from ..telemetry.spans import step_text
from .admission import Admission
from .blocks.store import BlockStore
from .history import SessionHistory
from .memories import MemoryService
from .observer import SessionObserver
from .outcomes import AppendOutcome, GenerateOutcome, NewSession, new_session_id
from .persistence import Persistence, Prewrite
from .placement import Placement, Released
from .prefix_cache import PrefixCache, PromptReader, start_token
from .recovery import Recovery, Replica
from .state_cache import StateCache
from .step import OutcomeReceipt, Progress, ReceiptOf, Steps, of_outcome
from .store.idempotency import Receipt
from .store.plumbing import now
from .store.responses import ResponseWrite
from .store.sessions import SessionMeta
from .store.stores import Stores
from .store.versions import VersionSummary


class SessionService:
    def __init__(
        self,
        *,
        settings: Settings,
        model: TransfoXLLMHeadModel,
        tokenizer: Tokenizer,
        worker: Worker,
        stores: Stores,
        blocks: BlockStore,
        budgets: MemoryBudgets,
        model_id: str,
        observer: SessionObserver | None = None,
        replica: Replica | None = None,
        exclusive: bool = False,
    ) -> None:
        self.settings = settings
        self.model = model
        self.tokenizer = tokenizer
        self.worker = worker
        self.model_id = model_id
        self.observer = observer or SessionObserver()
        self.default_mem_len, self.max_mem_len = settings.mem_lens(model.config.mem_len)
        self.start_id = start_token(tokenizer)
        self.stores = stores
        self.store = stores.sessions
        self.idempotency = stores.idempotency
        # Who this process is to other replicas (the holder of the sessions it commits), and whether it is the
        # only one using its Redis (a private Redis): see recovery.py.
        self.replica = replica or Replica.new(settings.port)
        self.recovery = Recovery(stores, me=self.replica, exclusive=exclusive, observer=self.observer)

        self.cache = StateCache(device_budget=budgets.device, host_budget=budgets.host)
        self.prefix_cache = PrefixCache(budget_bytes=budgets.prefix_cache, grid=worker.grid, salt=model_id)
        self.prompts = PromptReader(self.prefix_cache, worker, self.start_id)
        self.admission = Admission(
            settings=settings, model=model, worker=worker, cache=self.cache, store=self.store
        )
        self.persistence = Persistence(
            settings=settings,
            model=model,
            worker=worker,
            store=self.store,
            blocks=blocks,
            max_mem_len=self.max_mem_len,
            vocab_size=tokenizer.vocab_size,
        )
        self.placement = Placement(
            settings=settings,
            worker=worker,
            cache=self.cache,
            prefix_cache=self.prefix_cache,
            store=self.store,
            persistence=self.persistence,
            recovery=self.recovery,
            observer=self.observer,
        )
        self.steps = Steps(
            settings=settings,
            worker=worker,
            store=self.store,
            leases=stores.leases,
            placement=self.placement,
            persistence=self.persistence,
            recovery=self.recovery,
            observer=self.observer,
            holder=self.replica.id,
        )
        self.history = SessionHistory(
            recovery=self.recovery,
            steps=self.steps,
            placement=self.placement,
            persistence=self.persistence,
            store=self.store,
        )
        self.memories = MemoryService(
            settings=settings,
            tokenizer=tokenizer,
            worker=worker,
            store=stores.memories,
            prompts=self.prompts,
            admission=self.admission,
            placement=self.placement,
            persistence=self.persistence,
            observer=self.observer,
            model_id=model_id,
            mem_len=self.default_mem_len,
        )

    @property
    def segment_len(self) -> int:
        return self.worker.segment_len

    # ------------------------------------------------------------------ reading

    async def get(self, owner: str, session_id: str) -> SessionMeta:
        """The owner's session, if it can be continued; 410 if its memory is lost (recovery.py)."""
        return await self.recovery.get(owner, session_id)

    async def list_sessions(self, owner: str) -> list[SessionMeta]:
        """The owner's sessions that can be continued: never one whose memory is lost."""
        return await self.recovery.list_continuable(owner)

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
        receipt: ReceiptOf | None = None,
        klass: RequestClass | None = None,
    ) -> SessionMeta:
        """A new session that read `text`; `progress(tokens_done, tokens_total)` is called as the text is fed
        (first with 0, once the session is admitted). With `memory`, the preloaded memory's document first (its
        state shared: the cost does not depend on the document's length). `receipt`: the Idempotency-Key's
        record of the new session, written with it. `klass`: the request's class, by which the worker admits and
        schedules its work (admission.classes; here and in every step below)."""
        asked = NewSession(
            text=text,
            mem_len=mem_len,
            ttl_seconds=ttl_seconds,
            metadata=metadata,
            progress=progress,
            receipt=receipt,
            klass=klass,
        )
        if memory is not None:
            return await self._create_from(owner, memory, asked)
        meta, _ = await self._create_reading(owner, asked, self.tokenizer.encode(text))
        return meta

    async def create_reading(
        self, owner: str, text: str, tokens: list[int], klass: RequestClass | None = None
    ) -> tuple[SessionMeta, int]:
        """A new private session (`_register`) that read `text` (already encoded as `tokens`), for a step that
        follows at once, and how many of its tokens came from the prefix cache."""
        return await self._create_reading(owner, NewSession(text=text, klass=klass), tokens, private=True)

    async def _create_reading(
        self, owner: str, asked: NewSession, tokens: list[int], *, private: bool = False
    ) -> tuple[SessionMeta, int]:
        """A new session that read `asked.text` (encoded as `tokens`) through the prefix cache, and how many of
        its tokens came from the cache."""
        mem_len = self.default_mem_len if asked.mem_len is None else asked.mem_len
        if not 0 <= mem_len <= self.max_mem_len:
            raise InvalidRequest(f"mem_len must be between 0 and {self.max_mem_len}", param="mem_len")
        ttl = self.admission.ttl(asked.ttl_seconds)
        await self.admission.session(owner, mem_len)
        progress = asked.progress
        if progress is not None:
            progress(0, len(tokens))
        read = await self.prompts.read(owner, tokens, mem_len=mem_len, progress=progress, klass=asked.klass)
        meta = await self._register(
            owner,
            read.state,
            len(tokens),
            ttl,
            dict(asked.metadata or {}),
            kind="create",
            text=asked.text,
            private=private,
            receipt=asked.receipt,
            fed=[self.start_id, *tokens],
        )
        self.observer.on_tokens("ingested", len(tokens) + 1)
        self.observer.on_prefix_cache(read.cached, len(tokens) + 1)
        return meta, max(0, read.cached - 1)  # the start token is not the caller's

    async def _create_from(self, owner: str, memory_id: str, asked: NewSession) -> SessionMeta:
        """A new session holding the memory's state (its blocks shared), then `asked.text`: it continues exactly
        like a session that read the memory's document and then that text (`progress` as it is fed)."""
        ttl = self.admission.ttl(asked.ttl_seconds)
        async with self.memories.using(owner, memory_id) as (memory, state):
            if asked.mem_len is not None and asked.mem_len != memory.mem_len:
                raise InvalidRequest(
                    f"a session from this memory has its mem_len ({memory.mem_len})", param="mem_len"
                )
            await self.admission.session(owner, memory.mem_len)
            tokens = self.tokenizer.encode(asked.text)
            if tokens:
                progress = asked.progress
                job = AdvanceJob(state, tokens, report_progress=progress is not None, klass=asked.klass)
                result = await self.steps.run(job, progress=progress)
                assert isinstance(result, AdvanceResult)
                state = result.state
            else:
                state = state.retain()  # the session's own hold (the memory's is the cache's)
            meta = await self._register(
                owner,
                state,
                memory.tokens + len(tokens),
                ttl,
                dict(asked.metadata or {}),
                kind="create",
                text=asked.text,
                receipt=asked.receipt,
            )
        self.observer.on_tokens("ingested", len(tokens))
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
        private: bool = False,
        receipt: ReceiptOf | None = None,
        fed: list[int] | None = None,
    ) -> SessionMeta:
        """A new session at version 1 holding `state` (the caller's hold, which this takes): metadata (and its
        stored version: `fed`, the tokens an empty memory was fed to make it, if known) to Redis, state to the
        device. A `private` one (made for a turn that will commit its next version before anyone learns its id)
        skips the stored version, which that commit writes with its own: the turn's first token does not wait for
        it. Its state stays on the device (pinned) until that step ends."""
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
        summary = VersionSummary.of(1, tokens, stamp, kind, text)
        always = self.persistence.always
        await self.steps.create(
            meta,
            state,
            summary=summary,
            stored=always and not private,
            # nowhere else yet: it must not leave the device (its step unpins it)
            pin=always and private,
            receipt=receipt,
            fed=fed,
        )
        return meta

    async def delete(self, owner: str, session_id: str, *, receipt: Receipt | None = None) -> None:
        meta = await self.recovery.owned(owner, session_id)  # a gone session too: its owner may tidy up
        await self.steps.delete(meta, receipt=receipt)
        await self.persistence.forget(session_id)
        self.placement.forget(session_id)

    async def fork(
        self,
        owner: str,
        session_id: str,
        *,
        metadata: dict[str, Any] | None = None,
        version: int | None = None,
        receipt: ReceiptOf | None = None,
    ) -> SessionMeta:
        """A new session with the same memory as the session's newest version, or as `version` (its blocks
        shared: a fork costs a table, not a copy)."""
        meta = await self.get(owner, session_id)
        await self.admission.session(owner, meta.mem_len)
        if version is None or version == meta.version:
            state, tokens = await self.placement.fetch(meta), meta.tokens
        else:
            state, summary = await self.history.state_at(meta, version)
            tokens = summary.tokens
        child_metadata = dict(meta.metadata if metadata is None else metadata)
        return await self._register(
            owner, state, tokens, meta.ttl_seconds, child_metadata, kind="fork", receipt=receipt
        )

    # ------------------------------------------------------------------ moving sessions between deployments

    async def export_snapshot(self, owner: str, session_id: str) -> bytes:
        """The session as one safetensors blob: its memory, and its metadata in the header."""
        meta = await self.get(owner, session_id)
        with released(await self.placement.fetch(meta)) as state:
            return await self.persistence.export(meta, state)

    async def import_snapshot(
        self, owner: str, data: bytes, *, ttl_seconds: int | None = None, receipt: ReceiptOf | None = None
    ) -> SessionMeta:
        """A new session (new id, this owner) holding an exported session's memory."""
        imported = await self.persistence.imported(data)
        await self.admission.session(owner, imported.state.mem_len)
        ttl = self.admission.ttl(ttl_seconds)
        return await self._register(
            owner, imported.state, imported.tokens, ttl, imported.metadata, kind="import", receipt=receipt
        )

    # ------------------------------------------------------------------ steps

    async def append(
        self,
        owner: str,
        session_id: str,
        text: str,
        *,
        progress: Progress | None = None,
        receipt: OutcomeReceipt[AppendOutcome] | None = None,
        klass: RequestClass | None = None,
    ) -> AppendOutcome:
        """Feeds `text`; `progress(tokens_done, tokens_total)` is called as it is fed (first with 0, once the step
        holds the session). `receipt`: the Idempotency-Key's record of the outcome, written with the commit."""
        tokens = self.tokenizer.encode(text)
        async with self.steps.hold(owner, session_id) as (meta, state, lease):
            job = AdvanceJob(state, tokens, report_progress=progress is not None, klass=klass)
            result = await self.steps.run(job, lease, progress=progress)
            assert isinstance(result, AdvanceResult)
            logprob = result.logprob
            committed = await self.steps.commit(
                meta,
                result.state,
                meta.tokens + len(tokens),
                lease=lease,
                kind="append",
                text=text,
                receipt=of_outcome(receipt, lambda new: AppendOutcome(new, len(tokens), logprob)),
                fed=tokens,
            )
        self.observer.on_tokens("ingested", len(tokens))
        step_text(text)
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
        receipt: OutcomeReceipt[GenerateOutcome] | None = None,
        klass: RequestClass | None = None,
        on_held: Callable[[SessionMeta], None] | None = None,
        response: Callable[[GenerateOutcome], ResponseWrite | None] | None = None,
        holding_response: str | None = None,
    ) -> AsyncGenerator[TokenEvent | ProgressEvent | GenerateOutcome, None]:
        """Yields a TokenEvent per sampled token (with the `top_logprobs` likeliest alternatives, if asked),
        then the GenerateOutcome (after the commit). With `report_progress`, a text longer than one segment
        first yields a ProgressEvent per segment fed (a long prompt takes a while before the first token).

        Closing the iterator early (a client that went away) cancels the generation: nothing is committed.
        `prompt_tokens` (`text` encoded by the caller) are used as they are. `expected_version`, `on_held` and
        `holding_response` are checked once the step holds the session, before anything runs (Steps.hold): a
        caller need not read the session first. `receipt` (the Idempotency-Key's record) and `response` (the
        turn's response record) of the outcome are written with the commit.
        """
        check_max_tokens(self.settings, max_tokens)
        prompt = self.tokenizer.encode(text) if prompt_tokens is None else list(prompt_tokens)
        held = self.steps.hold(
            owner,
            session_id,
            expected_version=expected_version,
            check=on_held,
            holding_response=holding_response,
        )
        async with held as (meta, state, lease):
            if state.last_hidden is None and not prompt:  # pragma: no cover - sessions always start primed
                raise InvalidRequest("nothing to continue from: give text", param="text")
            job = GenerateJob(
                state,
                prompt,
                max_tokens,
                sampling,
                list(stop or []),
                top_logprobs=top_logprobs,
                klass=klass,
                # The worker reports a long prompt's segments as it feeds them, in the same job as the tokens.
                report_progress=report_progress and len(prompt) > self.segment_len,
                # Its fed prompt's blocks are written while it decodes, not by its commit (persistence.prewrite),
                # unless its commit is written ahead of its blocks (write-behind).
                report_prompt_state=self.persistence.always
                and not self.persistence.writes_behind(len(prompt) + max_tokens),
            )
            result: GenerateResult | None = None
            prewrite: Prewrite | None = None
            try:
                async with contextlib.aclosing(self.steps.events(job, lease)) as events:
                    async for event in events:
                        if isinstance(event, PromptFed):
                            prewrite = self.persistence.prewrite(event.state)
                        elif isinstance(event, TokenEvent | ProgressEvent):
                            yield event
                        elif isinstance(event, GenerateResult):
                            result = dataclasses.replace(event, prompt_tokens=len(prompt))
                assert result is not None
                finished = result
                committed = await self.steps.commit(
                    meta,
                    result.state,
                    meta.tokens + len(prompt) + result.completion_tokens,
                    lease=lease,
                    kind="generate",
                    text=text + result.text,
                    receipt=of_outcome(receipt, outcome := lambda new: GenerateOutcome(new, finished)),
                    prewrite=prewrite,
                    fed=[*prompt, *result.token_ids],
                    response=of_outcome(response, outcome),
                )
            finally:
                if prewrite is not None:
                    prewrite.cancel()  # done by now, unless the generation ended without a commit
        self.observer.on_tokens("ingested", len(prompt))
        self.observer.on_tokens("generated", result.completion_tokens)
        step_text(text, result.text)
        yield GenerateOutcome(committed, result)

    # ------------------------------------------------------------------ this process's states

    async def reap_expired(self) -> int:
        """Frees the memory of sessions whose TTL ran out (Redis already dropped their metadata)."""
        return await self.placement.reap_expired()

    async def release_all(self, deadline: float) -> Released:
        """At shutdown: the blocks being written behind their commits are written, then what only this process
        holds is saved or marked gone (placement.py)."""
        await self.persistence.settled(deadline - time.monotonic())
        return await self.placement.release_all(deadline)
