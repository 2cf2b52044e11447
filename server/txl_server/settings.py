"""Server settings: environment variables prefixed `TXL_` (e.g. `TXL_PORT=9000`), read when `Settings()` is made.

Nothing reads the environment at import time: `create_app(Settings(...))` in tests, `Settings()` from the
command line.
"""

from __future__ import annotations

import string
from enum import StrEnum
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

BUNDLED_MODEL_DIR = Path(__file__).parent / "default_model"
TRANSCRIPT_TEMPLATE = "{Role}: {content}\n"


class Persistence(StrEnum):
    """Where session memory may live besides this process."""

    NONE = "none"  # memory only here; beyond the host budget it is dropped (the session reports 410 gone)
    EVICT = "evict"  # evicted memory is written to Redis, and read back on the next request
    ALWAYS = (
        "always"  # every commit is written to Redis: survives restarts, any replica can serve any session
    )


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
    # Decoding iterations as CUDA graphs; default: on with a CUDA device. (On a CPU: the graphs' static
    # buffers, run eagerly; for tests.)
    cuda_graphs: bool | None = None
    segment_len: int | None = Field(
        None, ge=1, le=4096
    )  # ingestion chunk; default: the model's tgt_len, else 128
    max_mem_len: int | None = Field(
        None, ge=0, le=16384
    )  # the largest per-session mem_len; default: the model's
    default_mem_len: int | None = Field(None, ge=0, le=16384)  # default: the model's mem_len

    # ---- memory tiers and persistence
    device_memory_bytes: int = Field(2 * 1024**3, ge=0)
    host_memory_bytes: int = Field(4 * 1024**3, ge=0)
    persistence: Persistence = Persistence.EVICT
    # Versions of each session kept (rewind, forks at a version, Responses chaining); 0 keeps only the newest.
    keep_versions: int = Field(32, ge=0, le=1024)

    # ---- redis
    redis_url: str | None = None  # None: start a private redis-server for this process
    redis_data_dir: Path | None = (
        None  # embedded Redis: where it keeps its append-only file (default: a temp dir)
    )
    redis_prefix: str = "txl:"

    # ---- sessions
    default_ttl_seconds: int = Field(3600, ge=1)
    max_ttl_seconds: int = Field(7 * 24 * 3600, ge=1)
    max_sessions_per_tenant: int = Field(1000, ge=1)
    max_memories_per_tenant: int = Field(100, ge=1)  # preloaded memories (/v1/memories)
    idempotency_ttl_seconds: int = Field(24 * 3600, ge=1)
    lease_ttl_seconds: float = Field(
        10.0, gt=0
    )  # a crashed writer's lease expires after this (renewed at 1/3)

    # ---- limits
    max_body_bytes: int = Field(16 * 1024**2, ge=1024)  # also the largest scoring document
    max_text_chars: int = Field(1024**2, ge=1)  # prompt/append text
    max_tokens: int = Field(4096, ge=1)  # per generate request
    max_stop_strings: int = Field(8, ge=0)
    max_stop_chars: int = Field(64, ge=1)
    max_metadata_bytes: int = Field(4096, ge=2)
    max_concurrent_requests: int = Field(256, ge=1)  # beyond it: 429 overloaded
    max_queued_jobs: int = Field(512, ge=1)

    # ---- OpenAI compatibility
    # /v1/chat/completions: "transcript" ("{Role}: {content}\n" per message), or a per-message format with the
    # fields {role} (as sent), {Role} (capitalised) and {content}; "\n" and "\t" may be written escaped.
    # None: the route answers 404 (a base language model is served through /v1/completions).
    chat_template: str | None = None

    # ---- security and logging
    api_keys: SecretStr | None = None  # comma-separated; each key is a tenant
    api_keys_file: Path | None = None  # one "sha256:<hex>" (or plain key) per line
    log_prompts: bool = False
    log_level: str = "info"

    @field_validator("block_size")
    @classmethod
    def _power_of_two_block_size(cls, value: int) -> int:
        # The GPU decode kernel walks a block with tl.arange(0, block_size), which takes powers of two only.
        if value & (value - 1):
            raise ValueError(f"block_size must be a power of two (1, 2, 4, ..., 256), got {value}")
        return value

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

    @property
    def model_dir(self) -> Path:
        return self.model if self.model is not None else BUNDLED_MODEL_DIR
