"""Prometheus metrics (prefix `txl_`), in a registry per app so that several apps can live in one process.

Labels never carry user text or ids: routes are reported by their template (`/v1/sessions/{session_id}`).

Four of them have the fixed meaning that an inference endpoint picker reads (the Gateway API Inference Extension's
model server protocol, llm-d; vLLM's names in brackets): `txl_num_requests_waiting` (`num_requests_waiting`),
`txl_num_requests_running` (`num_requests_running`), `txl_kv_cache_usage_perc` (`kv_cache_usage_perc`, 0..1) and
`txl_cache_config_info` with the labels `block_size` and `num_gpu_blocks` (`cache_config_info`). docs/deploy.md
shows how to point a picker at them.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from txl import BlockPool

from .admission.targets import LatencyTargets
from .engine.worker import WorkerObserver
from .sessions.observer import SessionObserver

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ANY_CLASS = "any"  # the class label of a refusal before the body is read (a concurrency slot's)


class Metrics(WorkerObserver, SessionObserver):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "txl_requests", "HTTP requests by route and status", ["route", "method", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "txl_request_duration_seconds", "HTTP request time (streams: until the last byte)", ["route", "method"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.time_to_first_token = Histogram(
            "txl_time_to_first_token_seconds",
            "From request to the first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "txl_inter_token_latency_seconds", "Between consecutive generated tokens of one request",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            "txl_tokens", "Tokens processed", ["kind"], registry=r
        )  # ingested|generated|scored
        self.queue_depth = Gauge("txl_queue_depth", "Jobs waiting to be admitted by the worker", registry=r)
        self.active_jobs = Gauge("txl_active_jobs", "Jobs the worker is running", registry=r)
        self.batch_size = Histogram(
            "txl_batch_size", "Rows per decode forward", buckets=_BATCH_BUCKETS, registry=r
        )
        self.decode_seconds = Histogram(
            "txl_decode_step_seconds", "One decode forward", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.prefill_seconds = Histogram(
            "txl_prefill_step_seconds", "One ingestion segment", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.sessions = Gauge(
            "txl_sessions", "Sessions whose memory is in this process, by tier", ["tier"], registry=r
        )
        self.memory_bytes = Gauge(
            "txl_memory_bytes", "Bytes of session memory, by tier", ["tier"], registry=r
        )
        self.memory_budget = Gauge("txl_memory_budget_bytes", "Byte budget, by tier", ["tier"], registry=r)
        self.tier_moves = Counter(
            "txl_tier_moves", "Session memory moved between tiers", ["source", "target"], registry=r
        )
        self.evictions = Counter(
            "txl_evictions", "Session memory moved down a tier or dropped", ["target"], registry=r
        )
        self.restores = Counter(
            "txl_restores", "Session memory brought back to the device", ["source"], registry=r
        )
        self.conflicts = Counter(
            "txl_conflicts", "Steps refused because another step held the session", registry=r
        )
        self.cancellations = Counter("txl_cancellations", "Jobs cancelled (client gone)", registry=r)
        self.overloaded = Counter("txl_overloaded", "Requests refused with 429", registry=r)
        # ---- admission (admission/, engine/gate.py): by class (priority, default, flex, batch) and reason
        self.admissions = Counter(
            "txl_admissions", "Requests admitted by the worker, by class", ["class"], registry=r
        )
        self.refusals = Counter(
            "txl_refusals", "Requests refused with 429, by class (any: before the body is read) and reason",
            ["class", "reason"], registry=r,
        )  # fmt: skip
        self.queued = Gauge(
            "txl_queued_requests", "Requests admitted and not yet served (no segment fed, no token), by class",
            ["class"], registry=r,
        )  # fmt: skip
        self.queue_seconds = Histogram(
            "txl_queue_seconds", "From a job's admission to its first segment or token, by class", ["class"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.targets = Gauge(
            "txl_latency_target_seconds", "The latency targets admission and pacing keep (ttft, tbt)",
            ["target"], registry=r,
        )  # fmt: skip
        self.row_cap = Gauge(
            "txl_batch_row_cap", "Decoding rows the batch may hold now (paced to the tbt target)", registry=r
        )
        self.estimate_factor = Gauge(
            "txl_admission_estimate_factor",
            "First tokens' time as they came over admission's estimate, lately (it scales the estimate)",
            registry=r,
        )
        self.prefix_lookups = Counter(
            "txl_prefix_cache_lookups",
            "Prompts read through the prefix cache, by outcome",
            ["outcome"],
            registry=r,
        )  # hit|miss
        self.prefix_tokens = Counter(
            "txl_prefix_cache_tokens", "Prompt positions read, by where from", ["source"], registry=r
        )  # cache|computed
        # ---- the session store (sessions/settling.py, sessions/acked.py, sessions/store/redis_health.py)
        self.store_data_loss = Counter(
            "txl_store_data_loss",
            "The session store (Redis) was found to have lost data: a session's latest steps, a whole session, "
            "or the store (empty, older, replaced)",
            ["kind"],
            registry=r,
        )
        self.store_outcome_unknown = Counter(
            "txl_store_outcome_unknown",
            "Changes sent to Redis that got no answer, then settled (applied, not applied, or still unknown)",
            registry=r,
        )
        self.lease_lost = Counter(
            "txl_lease_lost", "Steps ended because their session's lease could not be kept", registry=r
        )
        self.unreplicated_commits = Counter(
            "txl_store_commits_unreplicated",
            "Commits answered before the replicas they waited for had them (Redis WAIT timed out)",
            registry=r,
        )
        # ---- for endpoint pickers (module docstring). Each job the worker runs is one request.
        self.requests_waiting = Gauge(
            "txl_num_requests_waiting",
            "Requests handed to the device worker and not yet admitted to its batch",
            registry=r,
        )
        self.requests_running = Gauge(
            "txl_num_requests_running",
            "Requests in the device worker's batch: feeding their input or decoding",
            registry=r,
        )
        self.pool = _PoolCollector()
        r.register(self.pool)

    def watch_pool(self, pool: BlockPool) -> None:
        """Reports `pool` (the device worker's) at every scrape: its use and its size."""
        self.pool.pool = pool

    # ---- WorkerObserver (called from the worker thread; prometheus_client is thread-safe)
    def on_prefill(self, tokens: int, seconds: float) -> None:
        self.prefill_seconds.observe(seconds)

    def on_decode(self, batch_size: int, seconds: float) -> None:
        self.batch_size.observe(batch_size)
        self.decode_seconds.observe(seconds)

    def on_queue(self, queued: int, active: int) -> None:
        self.queue_depth.set(queued)
        self.active_jobs.set(active)
        self.requests_waiting.set(queued)
        self.requests_running.set(active)

    def on_cancel(self) -> None:
        self.cancellations.inc()

    def on_admission(self, klass: str, refused: str | None) -> None:
        if refused is None:
            self.admissions.labels(klass).inc()
        else:
            self.refused(klass, refused)

    def refused(self, klass: str | None, reason: str) -> None:
        """A request refused with 429: of class `klass` (None: not known yet), for `reason`."""
        self.overloaded.inc()
        self.refusals.labels(klass or ANY_CLASS, reason).inc()

    def on_queued(self, depth: dict[str, int]) -> None:
        for klass, n in depth.items():
            self.queued.labels(klass).set(n)

    def on_queue_time(self, klass: str, seconds: float) -> None:
        self.queue_seconds.labels(klass).observe(seconds)

    def on_pacing(self, targets: LatencyTargets, row_cap: int, factor: float) -> None:
        self.targets.labels("ttft").set(targets.ttft)
        self.targets.labels("tbt").set(targets.tbt)
        self.row_cap.set(row_cap)
        self.estimate_factor.set(factor)

    # ---- SessionObserver
    def on_tier_move(self, source: str, target: str) -> None:
        self.tier_moves.labels(source, target).inc()
        if target == "device":
            self.restores.labels(source).inc()
        else:
            self.evictions.labels(target).inc()

    def on_conflict(self) -> None:
        self.conflicts.inc()

    def on_tokens(self, kind: str, n: int) -> None:
        self.tokens.labels(kind).inc(n)

    def on_prefix_cache(self, cached: int, total: int) -> None:
        self.prefix_lookups.labels("hit" if cached else "miss").inc()
        self.prefix_tokens.labels("cache").inc(cached)
        self.prefix_tokens.labels("computed").inc(total - cached)

    def on_store_loss(self, kind: str) -> None:
        self.store_data_loss.labels(kind).inc()

    def on_outcome_unknown(self) -> None:
        self.store_outcome_unknown.inc()

    def on_lease_lost(self) -> None:
        self.lease_lost.inc()

    def on_unreplicated_commit(self) -> None:
        self.unreplicated_commits.inc()


_USAGE = "txl_kv_cache_usage_perc"
_USAGE_HELP = (
    "Device memory pool in use: blocks held by sessions and running steps over blocks in the pool, 0..1"
)
_INFO = "txl_cache_config_info"
_INFO_HELP = "The device memory pool: positions per block and blocks in the pool (labels); the value is 1"
_INFO_LABELS = ["block_size", "num_gpu_blocks"]


class _PoolCollector(Collector):
    """The device memory pool, read when scraped (a gauge set at each step would lag behind frees)."""

    def __init__(self) -> None:
        self.pool: BlockPool | None = None

    def describe(self) -> Iterator[Metric]:
        """The families without samples: the registry checks their names against the other metrics'."""
        yield GaugeMetricFamily(_USAGE, _USAGE_HELP)
        yield GaugeMetricFamily(_INFO, _INFO_HELP, labels=_INFO_LABELS)

    def collect(self) -> Iterator[Metric]:
        pool = self.pool
        if pool is None:  # the engine has not started
            return
        capacity = pool.capacity
        yield GaugeMetricFamily(_USAGE, _USAGE_HELP, value=pool.used_blocks / capacity if capacity else 0.0)
        info = GaugeMetricFamily(_INFO, _INFO_HELP, labels=_INFO_LABELS)
        info.add_metric([str(pool.block_size), str(capacity)], 1.0)
        yield info
