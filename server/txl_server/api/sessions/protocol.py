"""What the session routes take and return (pydantic, at the edge only)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from txl.sampling import SamplingParams

from ..shared.limits import MAX_MEMORY_ID_CHARS, MaxTokens, Seed, StopStrings, Text, TtlSeconds
from ..shared.request_body import RequestBody
from ..shared.service_tier import SERVED_TIER, SERVICE_TIER, RequestedTier, ServedTier
from ..shared.timestamps import Seconds, SecondsUp

STREAM_DESCRIPTION = (
    "Answer with SSE: progress events while the text is fed (and keep-alive comments), then a `result` event "
    "holding the JSON answer. A long text then never times out a client."
)


# 256: a few sentences of a byte-level model (the bundled one), a paragraph of a word-level one.
DEFAULT_MAX_TOKENS = 256


class SessionObject(BaseModel):
    model_config = ConfigDict(from_attributes=True)  # made from a SessionMeta
    id: str
    object: Literal["session"] = "session"
    created_at: Seconds
    expires_at: SecondsUp
    tokens: int
    mem_tokens: int
    mem_len: int
    version: int
    model: str
    metadata: dict[str, Any]


class SessionCreate(RequestBody):
    # The example is what the API docs' sample bodies show: without one, they show each field's minimum
    # (mem_len 0, ttl_seconds 1), a session with no memory that expires in a second.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"text": "It was a dark and stormy night", "metadata": {"user": "ada"}}]
        },
    )
    text: Text = Field("", description="Text the session starts with (may be empty)")
    mem_len: int | None = Field(None, ge=0, description="Positions of memory to keep; default: the model's")
    ttl_seconds: TtlSeconds | None = Field(
        None, examples=[3600], description="Expires this long after its last use; default: the server's"
    )
    metadata: dict[str, Any] | None = Field(None, description="Your own JSON, returned with the session")
    stream: StrictBool = Field(False, description=STREAM_DESCRIPTION)
    memory: str | None = Field(
        None,
        max_length=MAX_MEMORY_ID_CHARS,
        description="Start from this preloaded memory (POST /v1/memories): as if its document came before `text`",
    )
    service_tier: RequestedTier | None = SERVICE_TIER


class SessionFork(RequestBody):
    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, Any] | None = Field(
        None, description="Metadata of the new session; default: the parent's"
    )
    version: int | None = Field(
        None, ge=1, description="Fork this kept version (GET .../versions); default: the newest"
    )


class SessionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SessionObject]


class AppendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: Text = Field(..., min_length=1, description="Text to add to the session")
    stream: StrictBool = Field(False, description=STREAM_DESCRIPTION)
    service_tier: RequestedTier | None = SERVICE_TIER


class AppendResponse(BaseModel):
    session: SessionObject
    tokens: int = Field(..., description="Tokens the text became")
    logprob: float = Field(..., description="Natural-log probability of those tokens given everything before")
    service_tier: ServedTier | None = SERVED_TIER


class GenerateRequest(RequestBody):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    text: Text = Field("", description="Text to add before generating")
    max_tokens: MaxTokens = Field(
        DEFAULT_MAX_TOKENS,
        description="Tokens to generate (fewer if a stop string appears); default 256, or the server's most",
    )
    temperature: float = Field(1.0, ge=0, le=100, description="0: greedy")
    top_k: int = Field(0, ge=0, description="0: no limit")
    top_p: float = Field(1.0, gt=0, le=1)
    stop: StopStrings = Field(None, description="Generation ends before the first of these strings")
    seed: Seed | None = None
    stream: StrictBool = False
    service_tier: RequestedTier | None = SERVICE_TIER

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed
        )


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class GenerateResponse(BaseModel):
    text: str
    finish_reason: Literal["length", "stop"]
    session: SessionObject
    usage: Usage
    service_tier: ServedTier | None = SERVED_TIER


# ---------------------------------------------------------------------------------------------- history


class VersionObject(BaseModel):
    model_config = ConfigDict(from_attributes=True)  # made from a VersionSummary
    version: int
    tokens: int = Field(..., description="Tokens of the session's text at this version")
    created_at: float
    kind: Literal["create", "append", "generate", "import", "rewind", "fork"]
    text_tail: str | None = Field(None, description="The end of the text this step added")


class VersionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VersionObject] = Field(..., description="Newest first")


class RewindRequest(RequestBody):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(..., ge=1, description="A kept version (GET .../versions) to continue from")


class RewindResponse(BaseModel):
    session: SessionObject
