"""Server settings: environment variables prefixed `TXL_` (e.g. `TXL_PORT=9000`), read when `Settings()` is made.

Nothing reads the environment at import time: `create_app(Settings(...))` in tests, `Settings()` from the
command line.
"""

from __future__ import annotations

import functools
import os
import re
import string
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

BUNDLED_MODEL_DIR = Path(__file__).parent / "default_model"
TRANSCRIPT_TEMPLATE = "{Role}: {content}\n"
NO_CHAT_TEMPLATE = "none"  # TXL_CHAT_TEMPLATE=none: no chat template, even where the model declares one


def chat_format(value: str) -> str:
    """A chat template as the server keeps it: "transcript", or a per-message format holding {content} once and
    no fields but {role} and {Role} ("\\n" and "\\t" written escaped are unescaped). ValueError otherwise."""
    if value == "transcript":
        return TRANSCRIPT_TEMPLATE
    value = value.replace("\\n", "\n").replace("\\t", "\t")
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
    except ValueError as exc:
        raise ValueError(f"chat_template is not a valid format: {exc}") from exc
    if fields.count("content") != 1 or not set(fields) <= {"role", "Role", "content"}:
        raise ValueError("chat_template must hold {content} once, and no fields but {role} and {Role}")
    return value


class Persistence(StrEnum):
    """Where session memory may live besides this process."""

    NONE = "none"  # memory only here: dropped beyond the host budget and at shutdown (then gone)
    EVICT = "evict"  # memory goes to Redis when evicted and at a graceful shutdown; a crash loses the rest
    ALWAYS = "always"  # every commit is written to Redis: survives crashes, any replica can serve any session


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TXL_", env_file=None, extra="ignore")

    # ---- serving
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    model: Path | None = None  # model directory (HF format + tokenizer.json); None: the bundled default model
    model_id: str | None = None  # name in the API; default: the model directory's name
    dtype: str = "float32"
    device: str = "cpu"
    threads: int = Field(
        0, ge=0
    )  # torch threads for the worker; 0: all cores but one on CPU (the event loop's)

    # ---- engine
    max_batch_size: int = Field(64, ge=1, le=1024)  # decode rows per forward
    # Tokens per forward: decoding rows plus prompt/append/scoring segments beside them (chunked prefill).
    # Default: 256 on a CPU, 2048 on a GPU.
    max_batch_tokens: int | None = Field(None, ge=1, le=65536)
    block_size: int = Field(16, ge=1, le=256)  # positions per block of the memory pool: a power of two
    # A memory pool allocated once that never grows (admission and preemption when full); default: on CUDA.
    fixed_pool: bool | None = None
    # Decoding iterations sent one ahead of reading their tokens (with graphs); default: wherever graphs run.
    overlap: bool | None = None
    # Decoding iterations as CUDA graphs; default: on with a CUDA device. (On a CPU: the graphs' static
    # buffers, run eagerly; for tests.)
    cuda_graphs: bool | None = None
    # The decode path (engine/decode_path.py): Triton's kernels on CUDA (TXL_TRITON_KERNELS=0: torch's), the C
    # kernels on a CPU (TXL_CPU_KERNELS=0: torch's), and the kernels a CPU's linear layers take ("measured": for
    # each layer shape the fastest of torch's, oneDNN's and the C loop, timed once on this machine; or one of
    # them wherever it runs). Whatever the path, it is checked against its torch variant at start-up, and kernels
    # that fail are not used.
    triton_kernels: bool = True
    cpu_kernels: bool = True
    linear_kernel: Literal["measured", "torch", "onednn", "c"] = "measured"
    segment_len: int | None = Field(
        None, ge=1, le=4096
    )  # ingestion chunk; default: the model's tgt_len, else 128
    max_mem_len: int | None = Field(
        None, ge=0, le=16384
    )  # the largest per-session mem_len; default: the model's
    default_mem_len: int | None = Field(None, ge=0, le=16384)  # default: the model's mem_len

    # ---- memory tiers and persistence
    # Byte budgets of session memory per tier; None: chosen for the device and the machine (memory_budgets.py:
    # on a GPU 2 GiB and 4 GiB; on a CPU a sixteenth of the machine's memory, and no host tier).
    device_memory_bytes: int | None = Field(None, ge=0)
    # States of recently read prompts at segment boundaries, on the device beside the sessions; None: a quarter of
    # the device's budget (on a CPU at most 16 sessions' worth); 0: no prefix cache.
    prefix_cache_bytes: int | None = Field(None, ge=0)
    host_memory_bytes: int | None = Field(None, ge=0)
    # "always" by default: a stateful server keeps its state, as a database keeps its rows (each step writes
    # the memory blocks its new positions touch; docs/benchmarks.md, persistence)
    persistence: Persistence = Persistence.ALWAYS
    # Versions of each session kept (rewind, forks at a version, Responses chaining); 0 keeps only the newest.
    keep_versions: int = Field(32, ge=0, le=1024)
    # Write-behind (persistence `always`): a step that fed at most this many tokens is acknowledged once Redis has
    # its version and those token ids, and its memory blocks are written right after; until they are, a reader of
    # the version (a restart, another replica) feeds the tokens again, after the last version whose blocks are
    # stored (at most this many in all). 0: every step's blocks are written before its commit.
    write_behind_tokens: int = Field(4096, ge=0, le=65536)
    # How long such a step's blocks wait before they are written: the answer's own last work goes first, and a
    # session's steps within this time write their blocks once (the newest version's).
    write_behind_delay_ms: int = Field(50, ge=0, le=600_000)

    # ---- redis
    # None: start a private redis-server for this process. redis://host:port/db, or for a Redis that fails over,
    # redis+sentinel://host:port[,host:port...]/master-name (sessions/store/connection.py).
    redis_url: str | None = None
    redis_password: SecretStr | None = None  # the Redis password (kept out of the URL, which is logged)
    redis_sentinel_password: SecretStr | None = None  # the Sentinels' password, if they have one
    # Every Redis call is answered within this long or fails (a change that got no answer is settled, never
    # reported as "nothing was changed": sessions/settling.py).
    redis_timeout_seconds: float = Field(5.0, gt=0, le=60)
    # A Redis whose maxmemory-policy evicts keys deletes live sessions silently: the server refuses to start on
    # one unless this accepts it.
    redis_allow_eviction: bool = False
    # A commit waits for this many replicas to acknowledge it (Redis WAIT) before it is answered; None: one when
    # the master has replicas, else none. redis_wait_timeout_ms bounds the wait (the commit is answered either
    # way: it is applied on the master; one not yet replicated is counted in txl_store_commits_unreplicated).
    redis_wait_replicas: int | None = Field(None, ge=0, le=16)
    redis_wait_timeout_ms: int = Field(1000, ge=1, le=60000)
    # The private Redis's directory (its append-only file). None: the user's data directory (see
    # `private_redis_dir`), so that sessions outlive the process like a database's rows.
    redis_data_dir: Path | None = None
    ephemeral: bool = False  # the private Redis in a temporary directory, deleted at shutdown
    redis_prefix: str = "txl:"

    # ---- the block store: where the memories of sessions at rest are (sessions/blocks/)
    # A directory (a local disk, or a filesystem every replica mounts: NFS, EFS, Filestore, CephFS) or an object
    # store URL (s3://bucket/prefix, gs://..., az://...; credentials from the standard environment variables).
    # None: `blocks` in the private Redis's directory, else blocks/<model> in the user's data directory. Replicas
    # sharing a Redis must share it.
    block_store: str | None = None
    # Sync each block file and its directory before a commit (a directory store): a power loss then loses nothing
    # acknowledged; without it a crash of the server loses nothing, one of the machine its last seconds.
    block_store_fsync: bool = False
    # A replica's local tier in front of a shared store (an object store by default): recently used blocks on
    # local disk, least recently used out past block_cache_bytes (None: 4 GiB for an object store, none for a
    # directory; 0: no local tier).
    block_cache_dir: Path | None = None
    block_cache_bytes: int | None = Field(None, ge=0)
    # After the session store (Redis) was found to have lost data, the block store keeps every block for this
    # long (a Redis restored from a backup finds its sessions' blocks), then collects what no version names.
    block_store_hold_seconds: float = Field(24 * 3600.0, ge=0)

    # ---- sessions
    default_ttl_seconds: int = Field(3600, ge=1)
    max_ttl_seconds: int = Field(7 * 24 * 3600, ge=1)
    max_sessions_per_tenant: int = Field(1000, ge=1)
    max_memories_per_tenant: int = Field(100, ge=1)  # preloaded memories (/v1/memories)
    idempotency_ttl_seconds: int = Field(24 * 3600, ge=1)
    lease_ttl_seconds: float = Field(
        10.0, gt=0
    )  # a crashed writer's lease expires after this (renewed at 1/3)
    # A step on a session another request is stepping waits this long for it (then 409 with Retry-After):
    # a client that sends two steps at once gets them done one after the other.
    lease_wait_seconds: float = Field(5.0, ge=0, le=600)

    # ---- shutdown
    # On SIGTERM/SIGINT: running requests get this long to finish (streams still open then end with an error
    # event); in persistence "evict", saving the sessions held in memory to Redis fits in the same time.
    # Kubernetes' terminationGracePeriodSeconds must be longer (deploy/k8s/server.yaml).
    shutdown_grace_seconds: float = Field(20.0, ge=0, le=3600)

    # ---- liveness
    # /health fails (and an orchestrator restarts the server) when work has waited this long with no step
    # finishing: far above the longest step (a segment of the largest batch) on any device served.
    worker_stall_seconds: float = Field(120.0, gt=0, le=86400)
    # `python -m txl_server` exits (status 3) once it is not alive, so that Docker's restart policy, compose or
    # systemd start it again as Kubernetes would (watchdog.py); false: only /health says so.
    exit_when_not_alive: bool = True

    # ---- limits
    max_body_bytes: int = Field(16 * 1024**2, ge=1024)  # also the largest scoring document
    max_text_chars: int = Field(1024**2, ge=1)  # prompt/append text
    max_tokens: int = Field(4096, ge=1)  # per generate request
    max_stop_strings: int = Field(8, ge=0)
    max_stop_chars: int = Field(64, ge=1)
    max_metadata_bytes: int = Field(4096, ge=2)
    max_concurrent_requests: int = Field(256, ge=1)  # beyond it: 429 overloaded
    max_queued_jobs: int = Field(512, ge=1)

    # ---- admission and fair share (docs/server.md, "Overload")
    # Requests are admitted when their first token can come within this many seconds, else refused at once (429,
    # Retry-After from the queue's drain). None: measured for the device at start-up (at least 1 s).
    ttft_target_seconds: float | None = Field(None, gt=0, le=600)
    # The decoding batch grows only while the gap between a stream's tokens stays within this. None: measured
    # for the device at start-up (at least 50 ms).
    tbt_target_seconds: float | None = Field(None, gt=0, le=60)
    # Requests of one API key in flight at once (its ceiling); None: no ceiling of its own, but the last eighth
    # of TXL_MAX_CONCURRENT_REQUESTS is kept for keys below their fair share (with API keys configured).
    max_concurrent_requests_per_tenant: int | None = Field(None, ge=1)
    # Weights of fair share, "TENANT=WEIGHT,...": a tenant of weight 2 gets twice the rows and prompt tokens of
    # one of weight 1 when both wait (1 for any other). TENANT is the key's tenant id, as the server names it: the
    # first 32 hex digits of the key's SHA-256 (`printf %s KEY | sha256sum | cut -c1-32`), or `anonymous`.
    tenant_weights: str | None = None
    # A connection's request head (line and headers) must arrive within this many seconds of the connection (or
    # of its previous answer): idle and slow-header connections are closed.
    header_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    # A request's body must arrive whole within this many seconds of its head: a body sent too slowly, or
    # that never ends, is answered 408 and its connection closed. It takes no concurrency slot meanwhile.
    body_timeout_seconds: float = Field(30.0, gt=0, le=3600)

    # ---- OpenAI compatibility
    # The chat template of /v1/chat/completions and of message input (Responses, conversations): "transcript"
    # ("{Role}: {content}\n" per message), or a per-message format with the fields {role} (as sent), {Role}
    # (capitalised) and {content}; "\n" and "\t" may be written escaped. Unset: the model directory's own, where
    # it declares one (its `chat_template.json`; the bundled model does); "none": no template even so. Without a
    # template chat answers 404 (a base language model is served through /v1/completions).
    chat_template: str | None = None
    # Where the template in force came from: "TXL_CHAT_TEMPLATE" or "model" (with_model_chat_template sets it).
    _chat_template_source: str | None = PrivateAttr(None)

    # ---- security and logging
    api_keys: SecretStr | None = None  # comma-separated; each key is a tenant
    api_keys_file: Path | None = None  # one "sha256:<hex>" (or plain key) per line
    log_prompts: bool = False
    log_level: str = "info"
    # "text" for a terminal; "json" for a log collector: one object per line (time, level, message, request id,
    # trace and span ids, session, tenant), uvicorn's access lines too (docs/deploy.md, "Logs").
    log_format: Literal["text", "json"] = "text"
    # Traces (sent when OTEL_EXPORTER_OTLP_ENDPOINT is set) carry no prompt or generated text unless this is on:
    # then a step's span holds what it read and wrote (gen_ai.input.messages, gen_ai.output.messages).
    trace_text: bool = False

    @field_validator("block_size")
    @classmethod
    def _power_of_two_block_size(cls, value: int) -> int:
        # The GPU decode kernel walks a block with tl.arange(0, block_size), which takes powers of two only.
        if value & (value - 1):
            raise ValueError(f"block_size must be a power of two (1, 2, 4, ..., 256), got {value}")
        return value

    # ---- replicas
    # This process's name in every response's X-TXL-Replica header; None: HOST-PORT (a pod's name and port).
    replica_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")

    @field_validator("tenant_weights")
    @classmethod
    def _valid_weights(cls, value: str | None) -> str | None:
        if value is not None:
            parse_weights(value)
        return value

    def tenant_weight(self, tenant: str) -> float:
        """`tenant`'s weight in fair share (TXL_TENANT_WEIGHTS; 1 for the others)."""
        return self._weights.get(tenant, 1.0)

    @functools.cached_property
    def _weights(self) -> dict[str, float]:
        return parse_weights(self.tenant_weights or "")

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in ("float32", "bfloat16", "float16"):
            raise ValueError("dtype must be float32, bfloat16 or float16")
        return value

    def mem_lens(self, model_mem_len: int) -> tuple[int, int]:
        """(default, largest) mem_len of a session, for a model trained with `model_mem_len`."""
        default = self.default_mem_len if self.default_mem_len is not None else model_mem_len
        largest = self.max_mem_len if self.max_mem_len is not None else max(model_mem_len, default)
        return default, largest

    @field_validator("chat_template")
    @classmethod
    def _valid_chat_template(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if value.strip().lower() == NO_CHAT_TEMPLATE:
            return NO_CHAT_TEMPLATE
        return chat_format(value)

    @field_validator("ephemeral")
    @classmethod
    def _ephemeral_needs_private_redis(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("redis_url"):
            raise ValueError(
                "ephemeral applies to the private Redis; with TXL_REDIS_URL sessions live in that Redis"
            )
        return value

    @property
    def has_api_keys(self) -> bool:
        """Whether requests need an API key (keys given, or a file of them)."""
        given = self.api_keys is not None and self.api_keys.get_secret_value().strip(", ") != ""
        return given or self.api_keys_file is not None

    @property
    def chat_template_source(self) -> str | None:
        """Where the chat template in force came from: "TXL_CHAT_TEMPLATE" (the operator), "model" (the model
        directory's `chat_template.json`), or None (no template)."""
        return self._chat_template_source

    def with_model_chat_template(self, declared: str | None) -> Settings:
        """These settings with the chat template in force: the operator's (TXL_CHAT_TEMPLATE), else `declared`
        (the model's own, already a checked format: `chat_format`), unless the operator said "none"."""
        operator = self.chat_template
        if operator == NO_CHAT_TEMPLATE or (operator is None and declared is None):
            chosen, source = None, None
        elif operator is not None:
            chosen, source = operator, "TXL_CHAT_TEMPLATE"
        else:
            chosen, source = declared, "model"
        resolved = self.model_copy(update={"chat_template": chosen})
        resolved._chat_template_source = source
        return resolved

    @property
    def model_dir(self) -> Path:
        return self.model if self.model is not None else BUNDLED_MODEL_DIR

    @property
    def served_model_id(self) -> str:
        """The model's name in the API: `model_id`, else the model directory's name."""
        if self.model_id:
            return self.model_id
        name = self.model_dir.name
        return "txl-books-byte" if name == BUNDLED_MODEL_DIR.name else name

    def private_redis_dir(self) -> Path | None:
        """Where the private Redis keeps sessions; None: a temporary directory (`ephemeral`).

        By default the user's data directory, one folder per model (a session continues only on the model that
        made it, so another model's server must neither list nor reconcile them away):
        `$XDG_DATA_HOME/txl-serve/redis/<model>`, else `~/.local/share/txl-serve/redis/<model>`."""
        if self.ephemeral:
            return None
        if self.redis_data_dir is not None:
            return self.redis_data_dir
        return user_data_dir() / "redis" / re.sub(r"[^A-Za-z0-9._-]", "_", self.served_model_id)


def block_store_location(settings: Settings) -> str:
    """Where the block store is: TXL_BLOCK_STORE, else `blocks` beside the private Redis's data (a temporary
    directory with --ephemeral), else blocks/<model> in the user's data directory."""
    if settings.block_store:
        return settings.block_store
    if settings.redis_url is None:
        redis_dir = settings.private_redis_dir()
        if redis_dir is not None:
            return str(redis_dir / "blocks")
        return ""  # ephemeral: the private Redis's temporary directory (runtime.py)
    return str(user_data_dir() / "blocks" / re.sub(r"[^A-Za-z0-9._-]", "_", settings.served_model_id))


def user_data_dir() -> Path:
    """The XDG base directory for this user's data (read when called, never at import)."""
    base = os.environ.get("XDG_DATA_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "txl-serve"


def parse_weights(text: str) -> dict[str, float]:
    """`TENANT=WEIGHT,...` as a mapping; ValueError for anything else."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        tenant, sep, weight = item.partition("=")
        if not sep or not re.fullmatch(r"[0-9a-f]{32}|anonymous", tenant.strip()):
            raise ValueError(f"tenant_weights: {item!r} is not TENANT=WEIGHT (a 32 hex digit tenant id)")
        value = float(weight)
        if not 0 < value <= 1000:
            raise ValueError(f"tenant_weights: the weight of {tenant.strip()} must be in (0, 1000]")
        weights[tenant.strip()] = value
    return weights
