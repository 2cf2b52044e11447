"""Fakes for the session parts' own tests (tests/server/sessions/test_<part>.py), as tests/server/engine's
scheduler tests have theirs: what each part talks to, small enough to read in one sitting. Tensors are real: states
live in a real (tiny) BlockPool, so that the tiers' byte budgets count what the server counts.

    pool(), state(pool, positions)   a tiny pool and a state holding `positions` positions in it
    FakeWorker                       `call` runs the function; a submitted job runs `compute(job)` (default: an
                                     append that adds its tokens' positions), and ends early when cancelled
    FakeSessionStore                 the session store (store/sessions.py) as a dict, with scripted failures
    FakeBlockStore                   the block store (sessions/blocks/) as a dict
    FakeLeases, FakeHeartbeats       leases and heartbeats (store/leases.py, store/heartbeats.py)
    Recorder                         a SessionObserver that counts what it is told
    Stored                           a real Persistence over a FakeWorker and the fake stores
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import torch
from txl import BlockPool, Memory, MemoryLayout
from txl_server.engine.jobs import (
    AdvanceJob,
    AdvanceResult,
    CancelledByClient,
    DoneEvent,
    ErrorEvent,
    Job,
    ProgressEvent,
)
from txl_server.engine.state import ModelState
from txl_server.errors import Conflict, NotFound
from txl_server.sessions.blocks.store import BlocksLost
from txl_server.sessions.observer import SessionObserver
from txl_server.sessions.persistence import Persistence
from txl_server.sessions.store.lease import Lease, new_token
from txl_server.sessions.store.sessions import SessionMeta
from txl_server.sessions.store.versions import BlocksMissing, LoadedVersion, VersionSummary, VersionWrite
from txl_server.settings import Settings

# One layer, one head of width 2: a position is 16 bytes (keys and values, float32), a block of 4 is 64.
LAYOUT = MemoryLayout(1, 1, 2, 2, torch.float32, torch.device("cpu"))
BLOCK = 4
BLOCK_BYTES = BLOCK * LAYOUT.bytes_per_position()
HIDDEN_BYTES = LAYOUT.d_model * 4  # a state's last hidden state, outside the pool


def pool(blocks: int = 64, *, growable: bool = True) -> BlockPool:
    return BlockPool(LAYOUT, block_size=BLOCK, blocks=blocks, growable=growable)


def state(pool: BlockPool, positions: int, *, fill: float = 1.0, mem_len: int = 64) -> ModelState:
    """A state holding `positions` positions (keys and values all `fill`) in `pool`: ceil(positions / 4) blocks
    and a last hidden state of its own."""
    tensors = {
        "keys.0": torch.full((1, 1, positions, 2), fill),  # [B, H, L, Dh]
        "values.0": torch.full((1, 1, positions, 2), -fill),
    }
    memory = Memory.from_tensors(LAYOUT, tensors, mem_len=mem_len, pool=pool)
    return ModelState(memory, torch.full((LAYOUT.d_model,), fill), (1, 2, 3))


def state_bytes(positions: int) -> int:
    """Bytes a lone state of `positions` positions takes in a tier."""
    return -(-positions // BLOCK) * BLOCK_BYTES + HIDDEN_BYTES


def meta(session_id: str = "s1", *, owner: str = "alice", version: int = 1, **fields: Any) -> SessionMeta:
    values: dict[str, Any] = {
        "id": session_id,
        "owner": owner,
        "created_at": 1000.0,
        "last_used": 1000.0,
        "ttl_seconds": 3600,
        "mem_len": 64,
        "model": "tiny",
        "tokens": 8,
        "version": version,
    }
    return SessionMeta(**{**values, **fields})


def summary(version: int, tokens: int = 8, kind: str = "append") -> VersionSummary:
    return VersionSummary.of(version, tokens, 1000.0 + version, kind, f"text of {version}")


class FakeModel:
    """What the session parts read of the model: its memory layout and config."""

    config = SimpleNamespace(same_length=False)

    def memory_layout(self) -> MemoryLayout:
        return LAYOUT


class FakeWorker:
    """The device worker: `call` runs the function at once; a submitted job runs `compute(job)` on the loop and
    ends with its result (or error). While `gate` is closed (cleared) jobs wait for it, ending early if cancelled,
    as the worker drops a cancelled job at its next iteration."""

    def __init__(self, block_pool: BlockPool, *, grid: int = BLOCK, segment_len: int = BLOCK) -> None:
        self.pool = block_pool
        self.grid = grid
        self.segment_len = segment_len
        self.on_pool_pressure: Callable[[int], None] | None = None
        self.calls = 0
        self.jobs: list[Job] = []
        self._running: set[asyncio.Task[None]] = set()
        self.gate = asyncio.Event()
        self.gate.set()
        self.compute: Callable[[Job], Awaitable[Any]] = self.append

    async def call(self, function: Callable[[], Any]) -> Any:
        self.calls += 1
        return function()

    def empty_state(self, mem_len: int) -> ModelState:
        return ModelState.empty(Memory(self.pool, mem_len=mem_len, grid=self.grid))

    def submit(self, job: Job) -> None:
        self.jobs.append(job)
        task = asyncio.ensure_future(self._run(job))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, job: Job) -> None:
        while not self.gate.is_set():
            if job.cancelled:
                job.emit(ErrorEvent(job.stop_reason or CancelledByClient("cancelled")))
                return
            await asyncio.sleep(0.01)
        try:
            job.emit(DoneEvent(await self.compute(job)))
        except Exception as exc:
            job.emit(ErrorEvent(exc))

    async def append(self, job: Job) -> AdvanceResult:
        """An AdvanceJob's result: its tokens' positions added (progress reported once, at the end)."""
        assert isinstance(job, AdvanceJob)
        if job.report_progress:
            job.emit(ProgressEvent(len(job.tokens), len(job.tokens)))
        after = state(self.pool, job.state.memory.length + len(job.tokens), fill=float(len(job.tokens)))
        return AdvanceResult(after, len(job.tokens), -float(len(job.tokens)), None)


Failure = BaseException | Callable[[], Awaitable[Any]]


class Scripted:
    """Methods that fail on cue: `fail("commit", Fenced())` makes the next `commit` raise it (a callable is
    awaited instead: a gate, or a failure that depends on the moment)."""

    def __init__(self) -> None:
        self._failures: dict[str, list[Failure]] = {}
        self.calls: Counter[str] = Counter()

    def fail(self, method: str, *failures: Failure) -> None:
        self._failures.setdefault(method, []).extend(failures)

    async def _cue(self, method: str) -> None:
        self.calls[method] += 1
        queue = self._failures.get(method)
        if queue:
            failure = queue.pop(0)
            if isinstance(failure, BaseException):
                raise failure
            await failure()


class FakeBlockStore(Scripted):
    """The block store: block id -> bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: dict[str, bytes] = {}
        self.writes: list[list[str]] = []  # the ids of each write, in order

    def encoded(self, blocks: dict[str, Any]) -> list[tuple[str, bytes]]:
        return [(block_id, bytes(data)) for block_id, data in blocks.items()]

    async def write_encoded(self, items: list[tuple[str, bytes]]) -> None:
        await self._cue("write_encoded")
        if not items:  # as the block store: nothing to send
            return
        self.writes.append([block_id for block_id, _ in items])
        self.blocks.update(items)

    async def read(self, ids: list[str]) -> list[bytes]:
        await self._cue("read")
        missing = {block_id for block_id in ids if block_id not in self.blocks}
        if missing:
            raise BlocksLost(missing, set())
        return [self.blocks[block_id] for block_id in ids]


class FakeSessionStore(Scripted):
    """The session store: metadata and stored versions in dicts. A version whose blocks `blocks` (a
    FakeBlockStore) lacks is refused whole with BlocksMissing, as Redis refuses one naming an expired block."""

    def __init__(self, blocks: FakeBlockStore | None = None) -> None:
        super().__init__()
        self.block_store = blocks
        self.sessions: dict[str, SessionMeta] = {}
        self.stored: dict[str, list[VersionWrite]] = {}  # oldest first
        self.reserved: dict[str, str] = {}  # id -> owner
        self.deleted: set[str] = set()
        self.tiers: list[tuple[str, str]] = []  # (id, tier) as touch_tier recorded them
        self.settled: bool | None = True  # what `settle` finds of a change whose reply was lost

    def put(self, session: SessionMeta, *stored: VersionWrite) -> SessionMeta:
        self.sessions[session.id] = session
        if stored:
            self.stored[session.id] = list(stored)
        return session

    def _check_blocks(self, write: VersionWrite | None) -> None:
        if write is None or self.block_store is None:
            return
        missing = {b for b in write.stored.block_ids if b not in self.block_store.blocks}
        if missing:
            raise BlocksMissing(missing)

    async def get(self, session_id: str) -> SessionMeta | None:
        await self._cue("get")
        return self.sessions.get(session_id)

    async def reserve(self, owner: str, session_id: str, *, limit: int, lease: Lease) -> bool:
        await self._cue("reserve")
        held = [s for s in self.sessions.values() if s.owner == owner] + [
            s for s, o in self.reserved.items() if o == owner
        ]
        if len(held) >= limit:
            return False
        self.reserved[session_id] = owner
        return True

    async def create(
        self, session: SessionMeta, write: VersionWrite | None = None, *, lease: Lease, receipt: Any = None
    ) -> None:
        await self._cue("create")
        self._check_blocks(write)
        self.reserved.pop(session.id, None)
        self.put(session, *([write] if write is not None else []))

    async def commit(
        self,
        session: SessionMeta,
        *,
        expected_version: int,
        lease: Lease,
        write: VersionWrite | None = None,
        drop_stored: bool = False,
        receipt: Any = None,
        response: Any = None,
    ) -> bool:
        await self._cue("commit")
        self._check_blocks(write)
        held = self.sessions.get(session.id)
        if held is None or held.version != expected_version:
            return False
        self.sessions[session.id] = session
        if write is not None:
            self.stored.setdefault(session.id, []).append(write)
        elif drop_stored:
            self.stored.pop(session.id, None)
        return True

    async def delete(self, session: SessionMeta, *, lease: Lease, receipt: Any = None) -> None:
        await self._cue("delete")
        self.sessions.pop(session.id, None)
        self.stored.pop(session.id, None)
        self.deleted.add(session.id)

    async def was_deleted(self, session_id: str) -> bool:
        return session_id in self.deleted

    async def list(self, owner: str) -> list[SessionMeta]:
        await self._cue("list")
        return [s for s in self.sessions.values() if s.owner == owner]

    async def count(self, owner: str) -> int:
        await self._cue("count")
        return len(await self.list(owner))

    async def count_exact(self, owner: str) -> int:
        await self._cue("count_exact")
        return len(await self.list(owner))

    async def scan(self) -> AsyncIterator[list[SessionMeta]]:
        yield list(self.sessions.values())

    async def mark_gone(self, session: SessionMeta, lost: str) -> bool:
        await self._cue("mark_gone")
        held = self.sessions.get(session.id)
        if held is None or held.version != session.version or held.tier == "gone":
            return False
        self.sessions[session.id] = dataclasses.replace(held, tier="gone", gone=str(lost))
        return True

    async def mark_lost(self, session: SessionMeta, lost: str) -> None:
        self.sessions[session.id] = dataclasses.replace(session, tier="gone", gone=str(lost))

    async def touch_tier(self, session_id: str, tier: str) -> None:
        await self._cue("touch_tier")
        self.tiers.append((session_id, tier))

    async def save_version(self, session_id: str, version: int, write: VersionWrite, ttl: int) -> bool:
        await self._cue("save_version")
        self._check_blocks(write)
        held = self.sessions.get(session_id)
        if held is None or held.version != version:
            return False
        self.stored[session_id] = [write]
        return True

    async def load_version(self, session_id: str, version: int | None = None) -> LoadedVersion | None:
        await self._cue("load_version")
        kept = self.stored.get(session_id, [])
        write = next((w for w in reversed(kept) if version in (None, w.summary.version)), None)
        if write is None:
            return None
        self._check_blocks(write)
        header = write.stored.header
        return LoadedVersion(
            write.summary.version, header, write.stored.hidden, [b""] * len(header["blocks"]), None, {}
        )

    async def versions(self, session_id: str) -> list[VersionSummary]:
        return [w.summary for w in self.stored.get(session_id, [])]

    async def newest_stored(self, ids: list[str]) -> dict[str, int]:
        return {i: self.stored[i][-1].summary.version for i in ids if self.stored.get(i)}

    async def ping(self) -> bool:
        return True

    async def settle(self, session_id: str, *, kind: str, lease: Lease) -> int | None:
        """The outcome of a change whose reply was lost: `settled` says whether it was applied."""
        await self._cue("settle")
        return self.sessions[session_id].version if self.settled else None


class FakeLeases(Scripted):
    """Leases: `step` reads the owner's session from `store` under a new lease; `renew` answers `renewals`
    (True: kept) or raises what `fail("renew", ...)` cued."""

    def __init__(self, store: FakeSessionStore, holder: str = "me#1") -> None:
        super().__init__()
        self.store = store
        self.holder = holder
        self.holding: dict[str, Lease] = {}
        self.renewals: list[bool] = []
        self.broken: list[tuple[str, str]] = []
        self.listed: list[tuple[str, str]] = []  # (id, token) of leases Redis holds, as `held` lists them

    @contextlib.asynccontextmanager
    async def step(
        self,
        session_id: str,
        owner: str,
        ttl_seconds: float,
        *,
        wait_seconds: float = 0.0,
        holding_response: str | None = None,
    ) -> AsyncIterator[tuple[SessionMeta, Lease]]:
        assert holding_response is None  # the fake holds no responses
        await self._cue("step")
        session = self.store.sessions.get(session_id)
        if session is None or session.owner != owner:
            raise NotFound(f"no session {session_id!r}", param="session_id")
        async with self.lease(session_id, ttl_seconds, wait_seconds=wait_seconds) as lease:
            yield session, lease

    @contextlib.asynccontextmanager
    async def lease(
        self, session_id: str, ttl_seconds: float, *, wait_seconds: float = 0.0
    ) -> AsyncIterator[Lease]:
        if session_id in self.holding:
            raise Conflict("busy", code="conflict")
        lease = Lease(session_id, new_token(self.holder), ttl_seconds)
        self.holding[session_id] = lease
        try:
            yield lease
        finally:
            del self.holding[session_id]

    async def renew(self, lease: Lease) -> bool:
        await self._cue("renew")
        return self.renewals.pop(0) if self.renewals else True

    async def held(self) -> AsyncIterator[tuple[str, str]]:
        for pair in self.listed:
            yield pair

    async def break_lease(self, session_id: str, token: str) -> bool:
        self.broken.append((session_id, token))
        return True


class FakeHeartbeats:
    def __init__(self, *live: str) -> None:
        self.alive = set(live)

    async def live(self, holders: Any) -> set[str]:
        return {h for h in holders if h in self.alive}


class Recorder(SessionObserver):
    """Counts every hook the session parts call (`moves`: each tier move as (source, target))."""

    def __init__(self) -> None:
        self.moves: list[tuple[str, str]] = []
        self.counts: Counter[str] = Counter()

    def on_tier_move(self, source: str, target: str) -> None:
        self.moves.append((source, target))

    def on_conflict(self) -> None:
        self.counts["conflict"] += 1

    def on_tokens(self, kind: str, n: int) -> None:
        self.counts[kind] += n

    def on_store_loss(self, kind: str) -> None:
        self.counts[f"loss:{kind}"] += 1

    def on_outcome_unknown(self) -> None:
        self.counts["outcome_unknown"] += 1

    def on_lease_lost(self) -> None:
        self.counts["lease_lost"] += 1


class Stored:
    """A fake worker, the fake session and block stores, and a real Persistence over them (snapshots of at most
    mem_len 64 and 256 token ids)."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings(keep_versions=3)
        self.worker = FakeWorker(pool())
        self.blocks = FakeBlockStore()
        self.store = FakeSessionStore(self.blocks)
        self.persistence = Persistence(
            settings=self.settings,
            model=FakeModel(),
            worker=self.worker,
            store=self.store,
            blocks=self.blocks,
            max_mem_len=64,
            vocab_size=256,
        )
