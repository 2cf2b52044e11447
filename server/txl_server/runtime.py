"""Everything one server process runs, assembled from settings and torn down in reverse.

model + tokenizer -> worker thread -> Redis (given or embedded) -> heartbeat, reconciliation -> session service
(+ expiry reaper) -> the Responses API's services beside it (turns, conversations, background jobs)

Every service is built here, once; the HTTP layer (api/) only takes them from the runtime and calls them.

It says where sessions are kept when it starts, and again when it stops; stopping first saves the sessions only
this process holds (persistence `evict`; sessions/recovery.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from redis import asyncio as aioredis
from txl import BlockPool, TransfoXLLMHeadModel, load_pretrained
from txl.kernels.cpu import linear
from txl.kernels.cpu.allocator import keep_freed_memory
from txl.tokenizers import Tokenizer, load_tokenizer

from .engine.decode_path import CheckedPath, PathSettings
from .engine.device_report import DeviceReport, describe
from .engine.selfcheck import prepare
from .engine.step_times import pace_worker
from .engine.worker import Worker, WorkerObserver
from .errors import Unavailable
from .memory_budgets import MemoryBudgets, describe_budgets, memory_budgets
from .session_stores import where_sessions_are, where_sessions_were
from .sessions.blocks.identity import reconcile as reconcile_block_store
from .sessions.blocks.migration import migrate as migrate_legacy_blocks
from .sessions.blocks.opening import open_blocks
from .sessions.blocks.store import BlockStore, Marker
from .sessions.blocks.sweeper import BlockSweeper
from .sessions.observer import SessionObserver
from .sessions.placement import Released
from .sessions.recovery import HEARTBEAT_SECONDS, HEARTBEAT_TTL_SECONDS, Recovery, Replica
from .sessions.redis_server import EmbeddedRedis
from .sessions.responses_services import ResponsesServices
from .sessions.service import SessionService
from .sessions.stateless import StatelessService
from .sessions.store.connection import connect_redis
from .sessions.store.plumbing import now
from .sessions.store.redis_health import RedisHealth
from .sessions.store.stores import Stores
from .settings import Persistence, Settings

log = logging.getLogger(__name__)

REAP_INTERVAL_SECONDS = 5.0


LoadedModel = tuple[TransfoXLLMHeadModel, Tokenizer, str]  # model, tokenizer, model id


class UnsupportedDtype(ValueError):
    """The settings' dtype cannot be computed at a usable speed on their device."""


def check_dtype(settings: Settings) -> None:
    """Refuses bfloat16 on a CPU that does not compute it natively. Such a CPU runs it, but as a scalar loop,
    hundreds of times slower than float32 (docs/benchmarks/engine-figures.md): a server that said ready and then
    timed out every request would be worse than one that does not start."""
    if (
        settings.dtype == "bfloat16"
        and settings.device.partition(":")[0] == "cpu"
        and not linear.cpu_runs_bfloat16()
    ):
        raise UnsupportedDtype(
            "this CPU has no native bfloat16 (it needs AVX-512 or AVX-NE-CONVERT), where bfloat16 runs hundreds "
            "of times slower than float32: use --dtype float32 (TXL_DTYPE=float32)"
        )


def load_model(settings: Settings) -> LoadedModel:
    check_dtype(settings)
    if torch.device(settings.device).type == "cpu":
        keep_freed_memory()  # prompt segments then reuse their pages instead of faulting in new ones
    model_dir = Path(settings.model_dir)
    model = load_pretrained(model_dir, dtype=settings.dtype, device=settings.device)
    tokenizer = load_tokenizer(model_dir)
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"{model_dir}: the tokenizer has {tokenizer.vocab_size} symbols but the model {model.config.vocab_size}"
        )
    return model, tokenizer, settings.served_model_id


def worker_threads(settings: Settings) -> int:
    """Torch threads for the worker. On a CPU, one core is left to the event loop: when the loop thread takes a
    core from one of torch's threads, every kernel waits at its barrier for the descheduled one (on 2 cores a
    decode step takes more than twice as long: docs/benchmarks/engine-figures.md)."""
    if settings.threads:
        return settings.threads
    cores = os.cpu_count() or 1
    return max(1, cores - 1) if torch.device(settings.device).type == "cpu" else max(1, min(cores, 4))


def device_pool(
    model: TransfoXLLMHeadModel, settings: Settings, budgets: MemoryBudgets, *, max_batch_tokens: int
) -> BlockPool:
    """The device's memory pool, allocated once, up front: the device budget (sessions at rest), the prefix
    cache's, and room for one iteration's new blocks beside them (a step's blocks exist before the memory tiers
    move other sessions out at its commit).

    On a GPU it never grows (vLLM allocates its KV cache once too): captured graphs hold its address, and doubling
    a pool sized near the GPU's memory would fail in the middle of a step. When it is full, the worker runs what
    fits, asks the session tiers to move idle sessions off the device, and preempts the newest work if that is not
    enough. On a CPU it grows on demand by default (`TXL_FIXED_POOL` chooses), and its pages are left untouched
    until blocks are first handed out (BlockPool): the memory it takes follows the sessions it holds."""
    layout = model.memory_layout()
    block_size = settings.block_size
    block_bytes = block_size * layout.bytes_per_position()
    one_iteration = max_batch_tokens // block_size + 2 * settings.max_batch_size
    fixed = settings.fixed_pool if settings.fixed_pool is not None else model.device.type == "cuda"
    return BlockPool(
        layout,
        block_size=block_size,
        blocks=(budgets.device + budgets.prefix_cache) // block_bytes + one_iteration + 2,
        growable=not fixed,
    )


def default_batch_tokens(device: torch.device, segment_len: int) -> int:
    """Tokens per forward: a CPU's forward time grows with its tokens, so it takes two segments at a time
    (decoding rows wait at most that long); a GPU's barely does until thousands."""
    return max(2 * segment_len, 256) if device.type == "cpu" else max(8 * segment_len, 2048)


def make_worker(
    settings: Settings,
    loaded: LoadedModel,
    observer: WorkerObserver | None = None,
    budgets: MemoryBudgets | None = None,
) -> Worker:
    """The device worker the settings describe, its pool allocated for `budgets` (default: those the settings
    give for the model; not started; on the reference path until `prepare_worker` chooses its own)."""
    model, tokenizer, _ = loaded
    if budgets is None:
        budgets = memory_budgets(settings, model)
    segment_len = settings.segment_len or model.config.segment_len
    max_batch_tokens = settings.max_batch_tokens or default_batch_tokens(model.device, segment_len)
    return Worker(
        model,
        tokenizer,
        segment_len=segment_len,
        max_batch_size=settings.max_batch_size,
        max_batch_tokens=max_batch_tokens,
        max_queued=settings.max_queued_jobs,
        pool=device_pool(model, settings, budgets, max_batch_tokens=max_batch_tokens),
        max_mem_len=settings.mem_lens(model.config.mem_len)[1],
        observer=observer,
        overlap=settings.overlap is not False,  # with graphs (the worker ignores it without)
        weight=settings.tenant_weight,
    )


def prepare_worker(settings: Settings, worker: Worker) -> CheckedPath:
    """Start-up on the device, before the worker starts: the decode path chosen and checked, every decoding graph
    captured and checked against the eager path (engine.selfcheck); what fails is turned off."""
    max_mem_len = settings.mem_lens(worker.model.config.mem_len)[1]
    return prepare(worker, PathSettings.of(settings), max_mem_len=max_mem_len)


class Runtime:
    def __init__(
        self,
        settings: Settings,
        *,
        worker_observer: WorkerObserver | None = None,
        session_observer: SessionObserver | None = None,
        loaded: LoadedModel | None = None,
    ) -> None:
        self.settings = settings
        self._loaded = loaded
        self.worker_observer = worker_observer
        self.session_observer = session_observer
        self.embedded_redis: EmbeddedRedis | None = None
        self.redis: aioredis.Redis | None = None
        self.health: RedisHealth | None = None
        self.worker: Worker | None = None
        self.service: SessionService | None = None
        self.stateless: StatelessService | None = None
        self.responses: ResponsesServices | None = None
        self.serving: CheckedPath | None = None
        self.budgets: MemoryBudgets | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._migration: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.blocks: BlockStore | None = None
        self.replica = Replica.new(settings.port)
        self.stopping = False  # shutting down: not ready for new traffic
        self.model_id = ""

    async def start(self) -> None:
        settings = self.settings
        torch.set_num_threads(worker_threads(settings))
        loaded, self._loaded = self._loaded, None  # used once: a restarted runtime loads afresh
        if loaded is None:
            loaded = await asyncio.to_thread(load_model, settings)
        model, tokenizer, self.model_id = loaded
        self.budgets = budgets = memory_budgets(settings, model)
        log.info("session memory budgets: %s", describe_budgets(budgets))
        self.worker = make_worker(settings, loaded, self.worker_observer, budgets)
        self.serving = await asyncio.to_thread(prepare_worker, settings, self.worker)
        await asyncio.to_thread(pace_worker, self.worker, settings)
        self.worker.start()
        url = settings.redis_url
        if url is None:
            self.embedded_redis = redis = EmbeddedRedis(settings.private_redis_dir())
            await asyncio.to_thread(redis.lock)  # may wait for a killed server's Redis to exit
            redis.launch()  # from the loop's thread, which lives as long as the server (see launch)
            url = await asyncio.to_thread(redis.wait_ready)
            log.info("started a private Redis at %s (data in %s)", url, redis.data_dir)
        self.redis = connect_redis(settings, url)
        self.blocks = blocks = open_blocks(settings, self.embedded_redis)
        stores = Stores.connect(
            self.redis,
            prefix=settings.redis_prefix,
            replica=self.replica.id,
            allow_eviction=settings.redis_allow_eviction,
        )
        self.health = stores.health
        stores.sessions.wait_timeout_ms = settings.redis_wait_timeout_ms
        stores.health.on_loss = self._on_store_loss
        if self.session_observer is not None:
            stores.sessions.on_unreplicated = self.session_observer.on_unreplicated_commit
        exclusive = self.embedded_redis is not None  # a private Redis has no other replica
        log.info("%s", where_sessions_are(settings, self.embedded_redis, self.blocks))
        try:
            await self._check_store(stores)
            await self._reconcile(stores, exclusive)
            pending = False
        except Unavailable as exc:  # the server still starts (and says it is not ready until Redis answers)
            log.warning("%s: sessions are reconciled once it answers", exc.message)
            pending = True
        self._heartbeat = asyncio.create_task(self._beat_forever(stores, exclusive, pending))
        self.service = SessionService(
            settings=settings,
            model=model,
            tokenizer=tokenizer,
            worker=self.worker,
            stores=stores,
            blocks=blocks,
            budgets=budgets,
            model_id=self.model_id,
            observer=self.session_observer,
            replica=self.replica,
            exclusive=exclusive,
        )
        self.stateless = StatelessService(
            model=model,
            tokenizer=tokenizer,
            worker=self.worker,
            prompts=self.service.prompts,
            mem_len=self.service.default_mem_len,
            observer=self.session_observer,
        )
        self.responses = ResponsesServices.over(self.service, keep_versions=settings.keep_versions)
        self._reaper = asyncio.create_task(self._reap_forever())
        sweeper = BlockSweeper(blocks, stores.sessions, hold_seconds=settings.block_store_hold_seconds)
        self._sweeper = asyncio.create_task(sweeper.run_forever())
        self._migration = asyncio.create_task(self._migrate(stores, blocks))

    async def _migrate(self, stores: Stores, blocks: BlockStore) -> None:
        """Moves the blocks an older server kept in Redis into the block store, once (blocks/migration.py)."""
        try:
            await migrate_legacy_blocks(stores.sessions, blocks)
        except Exception as exc:  # Redis or the block store away: sessions still move as they are used
            log.warning("could not move the blocks an older server kept in Redis: %s", exc)

    async def _reap_forever(self) -> None:
        assert self.service is not None
        while True:
            await asyncio.sleep(REAP_INTERVAL_SECONDS)
            try:
                await self.service.reap_expired()
            except Exception as exc:  # Redis away: try again next round
                log.debug("expiry sweep skipped: %s", exc)

    async def _reconcile(self, stores: Stores, exclusive: bool) -> None:
        # Alive before reconciling: a restart after `kill -9` replaces its earlier incarnation's heartbeat.
        await stores.heartbeats.beat(self.replica.name, self.replica.incarnation, HEARTBEAT_TTL_SECONDS)
        found = await Recovery(stores, me=self.replica, exclusive=exclusive).reconcile()
        if found.kept or found.lost or found.leases_broken:
            log.info(
                "%d sessions from before can be continued; %d whose memory was not saved are now gone "
                "(they answer 410 saying so); %d leases of stopped servers freed",
                found.kept,
                found.lost,
                found.leases_broken,
            )

    async def _check_store(self, stores: Stores) -> None:
        """Redis checked as a database (store/redis_health.py): refuses an evicting one (EvictingRedis), and a
        block store that is not Redis's (ForeignBlockStore); then how many replicas a commit waits for."""
        info = await stores.health.start()
        assert self.blocks is not None
        await reconcile_block_store(self.blocks, stores.health)
        stores.sessions.wait_replicas = self._replicas_to_wait(info.connected_replicas)

    def _on_store_loss(self, kind: str) -> None:
        """Redis was found to have lost data: counted, and the block store keeps every block a while (a Redis
        restored from a backup finds its sessions' blocks: blocks/sweeper.py)."""
        if self.session_observer is not None:
            self.session_observer.on_store_loss(kind)
        blocks, health = self.blocks, self.health
        if blocks is not None and health is not None and health.identity is not None:
            marker = Marker(health.identity, loss_at=now())
            task = asyncio.get_running_loop().create_task(blocks.write_marker(marker))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _replicas_to_wait(self, connected: int) -> int:
        wanted = self.settings.redis_wait_replicas
        return min(1, connected) if wanted is None else wanted

    async def _beat_forever(self, stores: Stores, exclusive: bool, reconcile_pending: bool) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                if reconcile_pending:
                    await self._check_store(stores)
                    await self._reconcile(stores, exclusive)
                    reconcile_pending = False
                else:
                    await stores.heartbeats.beat(
                        self.replica.name, self.replica.incarnation, HEARTBEAT_TTL_SECONDS
                    )
                    state = await stores.health.check()
                    if state.info is not None:
                        replicas = self._replicas_to_wait(state.info.connected_replicas)
                        stores.sessions.wait_replicas = replicas
            except Exception as exc:  # Redis away: beat again next round
                log.debug("heartbeat skipped: %s", exc)

    def save_reserve(self) -> float:
        """Seconds of the shutdown grace period kept for saving sessions after the requests: half of it with
        persistence `evict` and sessions held in memory, else none."""
        held = self.service is not None and len(self.service.cache) > 0
        evict = self.settings.persistence is Persistence.EVICT
        return self.settings.shutdown_grace_seconds / 2 if held and evict else 0.0

    def begin_shutdown(self) -> None:
        """No longer ready (a load balancer stops sending traffic); requests still running finish."""
        self.stopping = True

    async def stop(self, deadline: float | None = None) -> None:
        """Stops everything; the sessions only this process holds are saved (or marked gone) until `deadline`
        (time.monotonic(); default: the shutdown grace period from now)."""
        self.stopping = True
        if deadline is None:
            deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        if self.responses is not None:  # first: their turns end before the sessions they run on are let go
            await self.responses.stop()
        for task in (self._reaper, self._heartbeat, self._sweeper, self._migration, *self._background):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        released = None
        if self.service is not None:
            released = await self._release(self.service, deadline)
        if self.worker is not None:
            await asyncio.to_thread(self.worker.stop)
            if self.worker.stopped:
                self.worker.pool.release()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()
        if self.embedded_redis is not None:
            await asyncio.to_thread(self.embedded_redis.stop)
        if self.service is not None:
            log.info("%s", where_sessions_were(self.settings, self.embedded_redis, released))

    async def _release(self, service: SessionService, deadline: float) -> Released | None:
        try:
            released = await service.release_all(deadline)
            await service.stores.heartbeats.retire(self.replica.name, self.replica.incarnation)
        except Exception as exc:  # Redis away: start-up reconciliation marks what is lost
            log.warning("could not save the sessions held in memory: %s", exc)
            return None
        return released

    def device_report(self) -> DeviceReport | None:
        """What serves: device, dtype, attention kernel, graphs, pool and windows (None before start-up)."""
        if self.worker is None or self.serving is None or self.budgets is None:
            return None
        mem_len, max_mem_len = self.settings.mem_lens(self.worker.model.config.mem_len)
        return describe(
            self.worker, self.serving, mem_len=mem_len, max_mem_len=max_mem_len, budgets=self.budgets
        )

    async def ready(self) -> bool:
        """Whether the server should get traffic (`not_ready` says why not)."""
        return await self.not_ready() is None

    async def not_ready(self) -> str | None:
        """Why the server should get no traffic now, or None: stopping, not alive (`liveness`: a CUDA error that
        poisoned the context is not recovered from: failing readiness takes the server out of service, failing
        liveness restarts it), starting, Redis unreachable, or Redis unfit to keep sessions (evicting, out of
        memory, a read-only replica: store/redis_health.py)."""
        if self.stopping:
            return "the server is shutting down"
        alive = self.liveness()
        if alive is not None:
            return f"{alive}; restart the server"
        if self.service is None or self.health is None:
            return "the server is starting"
        try:
            state = await self.health.check()
        except Unavailable as exc:
            return exc.message
        return "; ".join(state.problems) or None

    def liveness(self) -> str | None:
        """Why the process must be restarted, or None while it is alive (`/health`): the device failed (a
        sticky error: nothing it computes can be trusted again), the worker's thread ended, or work has waited
        longer than TXL_WORKER_STALL_SECONDS with no step finishing (a hung kernel, a deadlock). While the
        model loads there is no worker yet: alive (the start-up probe gives loading its time)."""
        worker = self.worker
        if worker is None:
            return None
        if worker.device_error is not None:
            return "the device failed"
        if worker.died:
            return "the worker stopped"
        stalled = worker.stalled_for()
        if stalled > self.settings.worker_stall_seconds:
            return f"no step finished for {stalled:.0f} s with work waiting"
        return None
