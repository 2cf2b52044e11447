"""The OpenAI chat completions protocol: what `POST /v1/chat/completions` takes and returns (pydantic, at the edge
only), and its conversion to a completion request of the chat written out with the template."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from ...errors import InvalidRequest
from ..completions.protocol import (
    MAX_LOGPROBS,
    MAX_N,
    NOT_SUPPORTED_BUT_0,
    CompletionRequest,
    CompletionUsage,
    StreamOptions,
)
from ..shared.chat_template import ChatMessage, ChatTemplate
from ..shared.limits import MAX_USER_CHARS, MaxTokens, Seed, StopStrings
from ..shared.request_body import RequestBody
from ..shared.service_tier import SERVED_TIER, SERVICE_TIER, RequestedTier, ServedTier

DEFAULT_MAX_TOKENS = 256  # a reply, not a document: it usually ends earlier, at the user's next turn
# What a chat request passes on to its completion as it is.
_PASSED_ON = {
    "model",
    "temperature",
    "top_p",
    "stop",
    "stream",
    "stream_options",
    "seed",
    "n",
    "user",
    "frequency_penalty",
    "presence_penalty",
    "service_tier",
}


class ChatCompletionRequest(RequestBody):
    # Unknown fields are ignored, as OpenAI clients send options this server has no use for.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: MaxTokens | None = Field(None, description="Default 256, or the server's most")
    max_completion_tokens: MaxTokens | None = Field(
        None, description="The same as max_tokens, which it overrides"
    )
    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(1.0, gt=0, le=1)
    stop: StopStrings = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    seed: Seed | None = None
    n: int | None = Field(1, ge=1, le=MAX_N)
    user: str | None = Field(None, max_length=MAX_USER_CHARS)
    frequency_penalty: float | None = Field(None, ge=-2, le=2, json_schema_extra=NOT_SUPPORTED_BUT_0)
    presence_penalty: float | None = Field(None, ge=-2, le=2, json_schema_extra=NOT_SUPPORTED_BUT_0)
    # As OpenAI's: `true` and `false` are not counts, nor 1 and 0 booleans.
    logprobs: StrictBool | None = Field(
        None, description="Return each generated token's log-probability (choices[].logprobs)"
    )
    top_logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="With logprobs: the likeliest alternatives per token",
    )
    service_tier: RequestedTier | None = SERVICE_TIER

    def to_completion(self, template: ChatTemplate) -> CompletionRequest:
        """The completion of the chat written out with `template` (which stops where the user's next turn would
        begin: `template.stop()`, the server's own stop string, is not part of it)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        fields = self.model_dump(include=_PASSED_ON)
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if max_tokens is not None:  # else the chat's default (serving)
            fields["max_tokens"] = max_tokens
        if self.logprobs:
            fields["logprobs"] = self.top_logprobs or 0
        return CompletionRequest(**fields, prompt=template.prompt(self.messages))


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = Field(..., description="The token's text as UTF-8 bytes")


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(
        ..., description="The likeliest tokens at this position (top_logprobs)"
    )


class ChoiceLogprobs(BaseModel):
    """OpenAI's `logprobs` of a chat choice: one entry per generated token."""

    content: list[TokenLogprob] | None
    refusal: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["length", "stop"]
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage
    service_tier: ServedTier | None = SERVED_TIER
