"""Persistence: a session's state to the stores and back, and to a snapshot and back.

What the stores hold of a state is a stored version: its blocks' bytes in the block store (sessions/blocks/),
each written once and listed by every version that reads it, and in Redis the version's header and each block's
references (store/blocks.py). The server knows which pool blocks the store holds (`BlockIndex`), so a write sends
only the blocks it lacks, in parallel and off the event loop, before Redis hears of the version; if some of those
expired meanwhile, Redis refuses the version whole and it is sent again with every block. When a version is
written depends on the persistence mode (TXL_PERSISTENCE): `always` with every commit (store/sessions.py),
`evict` when the session leaves this process (placement.py), `none` never. A restored state is written into the
device's pool on the worker's thread, which owns it.

Every new version of a state (a step's commit, a new session, a preloaded memory, a session leaving this process)
is written durably first, then placed (`Durable.write_then_place`): the state cache never points to a version
Redis was not told of, and never lets go of one Redis does not hold.

Write-behind: since a session's state is a function of its tokens, a step that fed few tokens (at most
TXL_WRITE_BEHIND_TOKENS) is made durable by its token ids alone: Redis commits its version as the version before it
advanced by them (`ahead`, a Replay), and the step is answered without waiting for the block store; its blocks are
written right after, and settle the version (`settle_later`). A reader of a version not yet settled (a restart,
another replica) feeds its tokens again after the blocks it names (`restore`): the same state, by the same model.

A snapshot is one safetensors blob holding a session's memory with its metadata in the header: sessions move
between deployments as snapshots (export, then import as a new session).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from txl import TransfoXLLMHeadModel

from ..engine.jobs import AdvanceJob, AdvanceResult, job_result
from ..engine.state import ModelState, released, snapshot_metadata
from ..engine.worker import Worker
from ..errors import Gone, InvalidRequest
from ..settings import Persistence as PersistenceMode
from ..settings import Settings
from .blocks.backend import Payload
from .blocks.store import BlocksLost, BlockStore
from .state_cache import Entry
from .store.blocks import BlockIndex, BlockKey, StoredVersion, legacy_state, restore, snapshot
from .store.plumbing import now
from .store.sessions import SessionMeta, SessionStore
from .store.versions import BlocksMissing, LoadedVersion, Replay, ReplayRefused, VersionSummary, VersionWrite
from .write_behind import Pending, WriteBehind

T = TypeVar("T")
# What a durable write hands Redis besides the metadata: a stored version, a version ahead of its blocks (which
# becomes a stored version if Redis refuses it), or nothing (None).
W = TypeVar("W", VersionWrite, VersionWrite | Replay, None)


@dataclass(frozen=True)
class Durable(Generic[W]):
    """A state about to be written durably: `version` is its stored version, its new blocks already in the block
    store (None: Redis is told of the state by its metadata alone)."""

    persistence: Persistence
    state: ModelState
    version: W

    async def write_then_place(
        self, write: Callable[[W], Awaitable[T]], place: Callable[[T], Awaitable[None]]
    ) -> T:
        """The order every new version follows: `write(version)`, the one Redis write that makes the state
        durable (with every block again if Redis lacks some it was thought to hold), then `place(outcome)`,
        where this process keeps it (or lets it go). A write that raises places nothing. Not shielded from
        cancellation: a caller whose write must run to its end awaits this under `to_the_end` (step.py)."""
        if self.version is None:
            outcome = await write(self.version)
        else:
            outcome = await self.persistence.write(write, self.version, self.state)
        await place(outcome)
        return outcome


@dataclass(frozen=True)
class Prewritten:
    """Blocks of a state written to the block store ahead of its commit: each block's key and id, and when."""

    blocks: dict[BlockKey, str]
    written_at: float


class Prewrite:
    """A `Persistence.prewrite` under way: its result, or None if it failed (the commit writes them itself)."""

    def __init__(self, task: asyncio.Future[Prewritten]) -> None:
        self.task = task

    async def result(self) -> Prewritten | None:
        try:
            return await asyncio.shield(self.task)
        except Exception:  # the block store away: the commit tries again, and says so if it fails too
            return None

    def cancel(self) -> None:
        self.task.cancel()


@dataclass(frozen=True)
class Imported:
    """An exported session read back: its state (in the device's pool), its tokens and its metadata."""

    state: ModelState
    tokens: int
    metadata: dict[str, Any]


@dataclass(kw_only=True, eq=False)
class Persistence:
    settings: Settings
    model: TransfoXLLMHeadModel
    worker: Worker
    store: SessionStore
    blocks: BlockStore
    # What a snapshot must fit to be imported.
    max_mem_len: int
    vocab_size: int
    # Which pool blocks the block store already holds: a write sends only the others (store/blocks.py).
    index: BlockIndex = field(default_factory=BlockIndex, init=False)
    # The blocks of versions committed ahead of them, written shortly after (`settle_later`).
    behind: WriteBehind = field(init=False)

    def __post_init__(self) -> None:
        self.behind = WriteBehind(self._settle, delay=self.settings.write_behind_delay_ms / 1000)

    @property
    def always(self) -> bool:
        """Every commit writes its version (persistence `always`): Redis holds every session's kept versions."""
        return self.settings.persistence is PersistenceMode.ALWAYS

    def writes_behind(self, tokens: int) -> bool:
        """Whether a step feeding `tokens` tokens commits ahead of its blocks (persistence `always`)."""
        return self.always and 0 < tokens <= self.settings.write_behind_tokens

    @property
    def enabled(self) -> bool:
        """A session leaving this process goes to Redis (not `none`)."""
        return self.settings.persistence is not PersistenceMode.NONE

    # ------------------------------------------------------------------ writing versions

    async def prepare(
        self,
        state: ModelState,
        summary: VersionSummary,
        *,
        full: bool = False,
        early: Prewritten | None = None,
    ) -> Durable[VersionWrite]:
        """`state` ready to be written durably as the version `summary` describes: its new blocks (all with
        `full`) already in the block store (`early`: those written beforehand, see `prewrite`). Cancellable: no
        version names them yet."""
        return Durable(self, state, await self.version_write(state, summary, full=full, early=early))

    def ahead(
        self, state: ModelState, summary: VersionSummary, tokens: list[int]
    ) -> Durable[VersionWrite | Replay]:
        """`state`, the state of the session's committed version advanced by `tokens`, to be written durably ahead
        of its blocks (`writes_behind`): as the version before it and these tokens, or, if Redis will not (the
        version before is no longer kept, or readers would feed too many tokens again), with its blocks."""
        limit = self.settings.write_behind_tokens
        return Durable(
            self, state, Replay(summary, tuple(tokens), state.fed, self.settings.keep_versions, limit)
        )

    def first_ahead(
        self, state: ModelState, summary: VersionSummary, tokens: list[int]
    ) -> Durable[VersionWrite]:
        """A new session's `state`, an empty memory advanced by `tokens` (its start token first), to be written
        durably ahead of its blocks: as the empty memory's header and these tokens (`writes_behind`)."""
        if len(tokens) != state.fed:
            raise ValueError("the tokens given are not those the state was fed")
        with released(self.worker.empty_state(state.mem_len)) as empty:
            stored = snapshot(empty, BlockIndex())
        keep = self.settings.keep_versions
        return Durable(self, state, VersionWrite(stored, summary, keep, now(), tuple(tokens)))

    def unstored(self, state: ModelState) -> Durable[None]:
        """`state` to be made durable by its metadata alone (no stored version: its memory stays in this
        process until it leaves it)."""
        return Durable(self, state, None)

    async def version_write(
        self,
        state: ModelState,
        summary: VersionSummary,
        *,
        full: bool = False,
        early: Prewritten | None = None,
    ) -> VersionWrite:
        """The state as a version to store, its new blocks (those the store does not hold yet; all with `full`)
        read off the loop and written to the block store: a version never names a block not yet written.
        `early`: blocks of this state written beforehand (`prewrite`), not written again."""
        known = early.blocks if early is not None else None

        def encode() -> tuple[StoredVersion, list[tuple[str, Payload]]]:  # one hand-off to a thread for both
            stored = snapshot(state, self.index, full=full, prewritten=known)
            return stored, self.blocks.encoded(stored.new_blocks)

        written_at = now()
        stored, encoded = await asyncio.to_thread(encode)
        await self.blocks.write_encoded(encoded)
        if early is not None and stored.prewritten:
            written_at = min(written_at, early.written_at)
        return VersionWrite(stored, summary, self.settings.keep_versions, written_at)

    def prewrite(self, state: ModelState) -> Prewrite:
        """Starts writing, now, the blocks of a state a step will commit a later state of (a generation's fed
        prompt, while it decodes): its blocks that the decoding leaves as they are are then written before the
        commit, not by it. Nothing names them until that commit does (the sweeper collects them otherwise).
        `state` is the caller's hold, which this takes: released once its blocks are read (or it is cancelled)."""

        async def write() -> Prewritten:
            def encode() -> tuple[StoredVersion, list[tuple[str, Payload]]]:
                with released(state):  # its blocks are read: the decoding's newer states hold what they keep
                    stored = snapshot(state, self.index)
                    return stored, self.blocks.encoded(stored.new_blocks)

            with released(state):  # cancelled before it was read (idempotent after)
                written_at = now()
                stored, encoded = await asyncio.to_thread(encode)
            await self.blocks.write_encoded(encoded)
            return Prewritten(dict(stored.learned), written_at)

        return Prewrite(asyncio.ensure_future(write()))

    async def write(
        self,
        call: Callable[[Any], Awaitable[T]],
        write: VersionWrite | Replay,
        state: ModelState,
    ) -> T:
        """Runs a store write; if Redis lacks blocks the index thought the store held (they expired), or took too
        long to hear of the new ones, writes every block again. The index then learns the blocks written. A
        Replay Redis refuses is written with its blocks."""
        if isinstance(write, Replay):
            try:
                return await call(write)
            except ReplayRefused:
                write = await self.version_write(state, write.summary)
        try:
            result = await call(write)
        except BlocksMissing as exc:
            self.index.forget(exc.ids)
            write = await self.version_write(state, write.summary, full=True)
            result = await call(write)
        self.index.learn(write.stored.learned)
        return result

    def settle_later(self, session_id: str, summary: VersionSummary, state: ModelState, ttl: int) -> None:
        """Writes the blocks of a version committed ahead of them (`ahead`) shortly after the answer, then settles
        it in Redis: its own header replaces the one it read (write_behind.py). `state` is the caller's hold,
        which this takes."""
        self.behind.add(Pending(session_id, summary, state, ttl))

    async def forget(self, session_id: str) -> None:
        """A deleted session's blocks are not written behind (write_behind.py)."""
        await self.behind.forget(session_id)

    async def settled(self, timeout: float) -> None:
        """Writes the blocks still behind their versions now, waiting up to `timeout` seconds (at shutdown)."""
        await self.behind.flush(timeout)

    async def _settle(self, pending: Pending) -> None:
        """Writes a version's blocks (those the store lacks), then settles it in Redis."""
        state, summary, session_id = pending.state, pending.summary, pending.session_id
        write = await self.version_write(state, summary)
        try:
            settled = await self.store.settle_version(session_id, write, pending.ttl)
        except BlocksMissing as exc:  # some expired, or the writing took too long: all of them again
            self.index.forget(exc.ids)
            write = await self.version_write(state, summary, full=True)
            settled = await self.store.settle_version(session_id, write, pending.ttl)
        if settled:
            self.index.learn(write.stored.learned)

    async def save(self, session_id: str, entry: Entry, *, then: Callable[[], Awaitable[None]]) -> None:
        """Writes the state of a session leaving this process (persistence `evict`) as its one stored version, if
        the session is still at the entry's version (else there is nothing of it to keep), then runs `then` (the
        state leaves this process)."""
        meta = await self.store.get(session_id)
        if meta is None or meta.version != entry.version or meta.tier == "gone":
            await then()
            return
        summary = (
            entry.summaries[-1]
            if entry.summaries
            else VersionSummary.of(meta.version, meta.tokens, meta.last_used, "append", None)
        )
        durable = await self.prepare(entry.state, summary)
        ttl = meta.ttl_seconds

        async def write(stored: VersionWrite) -> bool:
            return await self.store.save_version(session_id, entry.version, stored, ttl)

        async def leave(_: bool) -> None:
            await then()

        await durable.write_then_place(write, leave)

    # ------------------------------------------------------------------ reading versions

    async def read(self, meta: SessionMeta) -> ModelState | None:
        """The session's stored state at its committed version, in the device's pool; None if Redis does not hold
        that version. Gone if Redis holds it but it cannot be read back."""
        try:
            stored = await self.store.load_version(meta.id)
        except BlocksMissing as exc:
            raise Gone("this session's stored memory has expired", param="session_id") from exc
        if stored is None or stored.version != meta.version:
            return None
        try:
            return await self.restore(stored)
        except ValueError as exc:
            raise Gone(
                "this session's stored memory does not fit the loaded model", param="session_id"
            ) from exc

    async def restore(self, stored: LoadedVersion) -> ModelState:
        """A stored version read back (its blocks from the block store, or Redis for an older server's), in the
        device's pool (written on the worker thread). Gone (code `store_blocks_missing`) if the block store lacks
        some of its blocks or holds them damaged."""
        if stored.legacy is not None:
            return await self._load(stored.legacy)
        assert stored.header is not None
        header, hidden = stored.header, stored.hidden
        layout, pool, grid = self.model.memory_layout(), self.worker.pool, self.worker.grid
        if stored.legacy_blocks:
            blocks = stored.legacy_blocks
            return await self.worker.call(
                lambda: legacy_state(header, hidden, blocks, layout, pool, grid=grid)
            )
        data = await self._block_bytes(header, stored.blocks)
        # An older server's blocks (their bytes in Redis) are not learned: the next commit writes them to the block
        # store, and Redis's copy goes with the versions that list it.
        index = self.index if all(not b for b in stored.blocks) else BlockIndex()
        state = await self.worker.call(lambda: restore(header, hidden, data, layout, pool, index, grid=grid))
        if not stored.replay:
            return state
        if any(not 0 <= t < self.vocab_size for t in stored.replay):
            state.release()
            raise ValueError("the stored version's token ids do not fit this model's vocabulary")
        return await self._replayed(state, list(stored.replay))

    async def _replayed(self, state: ModelState, tokens: list[int]) -> ModelState:
        """A version committed ahead of its blocks: the state its header names (`state`, this call's hold), advanced
        by the tokens it fed after it."""
        with released(state):
            result = await job_result(self.worker, AdvanceJob(state, tokens))
        assert isinstance(result, AdvanceResult)
        return result.state

    async def _block_bytes(self, header: dict[str, Any], in_redis: list[bytes]) -> list[bytes]:
        """Every block's bytes, in table order: those Redis does not hold read from the block store."""
        ids = list(header.get("blocks", []))
        wanted = [i for i, data in enumerate(in_redis) if not data]
        try:
            fetched = await self.blocks.read([ids[i] for i in wanted])
        except BlocksLost as exc:
            raise Gone(
                f"this session's stored memory is incomplete: {len(exc.missing)} of its blocks are missing from "
                f"the block store and {len(exc.damaged)} damaged there (deleted by hand, or a write cut short); "
                "it cannot be continued",
                param="session_id",
                code="store_blocks_missing",
            ) from exc
        data = list(in_redis)
        for i, block in zip(wanted, fetched, strict=True):
            data[i] = block
        return data

    async def _load(self, data: bytes) -> ModelState:
        """A snapshot's state, in the device's pool (written on the worker thread)."""
        layout, pool = self.model.memory_layout(), self.worker.pool
        same_length, grid = self.model.config.same_length, self.worker.grid
        return await self.worker.call(
            lambda: ModelState.from_bytes(data, layout, pool, grid=grid, same_length=same_length)
        )

    # ------------------------------------------------------------------ snapshots

    async def export(self, meta: SessionMeta, state: ModelState) -> bytes:
        """The session as one safetensors blob: its memory, and its metadata in the header."""
        extra = {
            "txl_snapshot": "1",
            "model": meta.model,
            "tokens": str(meta.tokens),
            "version": str(meta.version),
            "metadata": json.dumps(meta.metadata),
        }
        return await asyncio.to_thread(state.to_bytes, extra)

    async def imported(self, data: bytes) -> Imported:
        """An exported session's state, tokens and metadata, checked against this server's model."""
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
        if any(not 0 <= t < self.vocab_size for t in state.tail):
            raise InvalidRequest("the snapshot's token ids do not fit this model's vocabulary", param="body")
        return Imported(state, tokens, metadata)
