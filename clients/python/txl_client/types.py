"""Typed results, mirroring the server's JSON. Fields the server adds later are kept (extra="allow"), not lost."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Session(_Model):
    id: str
    object: Literal["session"] = "session"
    created_at: int
    expires_at: int
    tokens: int  # every token the session has seen
    mem_tokens: int  # how many of them its memory holds (at most mem_len)
    mem_len: int
    version: int  # +1 per committed step (append, generate)
    model: str
    metadata: dict[str, Any] = {}


class SessionVersion(_Model):
    """A committed step of a session that the server keeps (TXL_KEEP_VERSIONS), to rewind or fork from."""

    version: int
    tokens: int  # tokens of the session's text at this version
    created_at: float
    kind: Literal["create", "append", "generate", "import", "rewind", "fork"]
    text_tail: str | None = None  # the end of the text this step added


class Usage(_Model):
    prompt_tokens: int
    completion_tokens: int


class AppendResult(_Model):
    session: Session
    tokens: int  # tokens the appended text became
    logprob: float  # natural-log probability of those tokens given everything before


class TokenEvent(_Model):
    """One generated token, as it arrives on a stream."""

    type: Literal["token"] = "token"
    id: int
    text: str  # may be "" while a multi-byte character or a word is incomplete
    logprob: float


class GenerateResult(_Model):
    """The whole generation: the non-streamed response, or a stream's final `done` event."""

    text: str
    finish_reason: Literal["length", "stop"]
    session: Session
    usage: Usage


class Progress(_Model):
    """How far the server is in feeding a text: a document being scored, a long prompt before its first token."""

    type: Literal["progress"] = "progress"
    tokens_done: int
    tokens_total: int


ScoreProgress = Progress  # the name of earlier versions


class ScoreResult(_Model):
    object: Literal["score"] = "score"
    tokens: int
    bytes: int
    logprob: float  # natural-log probability of the whole document
    nll: float  # mean negative log-likelihood per token, in nats
    perplexity: float
    bits_per_byte: float
    token_logprobs: list[float] | None = None  # with token_logprobs=True
    token_texts: list[str] | None = None

    @property
    def token_surprisals(self) -> list[float] | None:
        """-log2 p of each token, in bits (what the playground's heatmap shows)."""
        if self.token_logprobs is None:
            return None
        return [-lp / math.log(2) for lp in self.token_logprobs]


class ModelCard(_Model):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "txl-serve"


class Health(_Model):
    status: str


class Work(_Model):
    requests_running: int  # requests the server's device worker runs now, sharing its forwards
    requests_waiting: int = 0  # handed to the worker, not yet taken into its forwards


class SystemInfo(_Model):
    """What serves (`GET /v1/system`): the model, the server's version, and what its worker is doing now (the
    rest of the answer, the device and how it serves, is kept as extra fields)."""

    object: Literal["system"] = "system"
    model: str
    version: str
    work: Work | None = None


class Memory(_Model):
    """A preloaded memory: a document the server has read once, that sessions start from (`client.memories`)."""

    id: str  # "mem_..."
    object: Literal["memory"] = "memory"
    name: str | None = None
    tokens: int  # tokens the document became
    bytes: int  # UTF-8 bytes of the document
    mem_tokens: int  # positions its memory holds (the same for any long document)
    mem_len: int
    model: str
    created_at: int
    updated_at: int
    expires_at: int  # fixed: using the memory does not extend it (update(ttl_seconds=...) does)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Conversation(_Model):
    """A conversation (`client.conversations`): a session, and its items (`conv_` then the session's id)."""

    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str] = Field(default_factory=dict)


class ConversationItem(_Model):
    """A message of a conversation: a user's (or system's) input, or the assistant's reply."""

    id: str
    type: Literal["message"] = "message"
    role: str
    status: str = "completed"
    content: list[dict[str, Any]]

    @property
    def text(self) -> str:
        return "".join(str(part.get("text", "")) for part in self.content)


class Reply(_Model):
    """A response (OpenAI's Responses API) in a conversation: its id, status and text, and its usage (input
    tokens, the cached ones among them, output tokens)."""

    id: str
    status: str
    output: list[dict[str, Any]] = Field(default_factory=list)
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(str(part.get("text", "")) for item in self.output for part in item.get("content", []))
