"""The OpenAI chat completions protocol: what `POST /v1/chat/completions` takes and returns (pydantic, at the edge
only), and its conversion to a completion request of the chat written out with the template."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ...errors import InvalidRequest
from ..completions.protocol import MAX_LOGPROBS, MAX_N, CompletionRequest, CompletionUsage, StreamOptions
from ..shared.chat_template import ChatMessage, ChatTemplate
from ..shared.limits import MAX_USER_CHARS, MaxTokens, Seed

DEFAULT_MAX_TOKENS = 256  # a reply, not a document: it usually ends earlier, at the user's next turn
# What a chat request passes on to its completion as it is.
_PASSED_ON = {
    "model",
    "temperature",
    "top_p",
    "stream",
    "stream_options",
    "seed",
    "n",
    "user",
    "frequency_penalty",
    "presence_penalty",
}


class ChatCompletionRequest(BaseModel):
    # Unknown fields are ignored, as OpenAI clients send options this server has no use for.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: Seed | None = None
    n: int | None = Field(1, ge=1, le=MAX_N)
    user: str | None = Field(None, max_length=MAX_USER_CHARS)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def to_completion(self, template: ChatTemplate) -> CompletionRequest:
        """The completion of the chat written out with `template`, stopping where the user's next turn would
        begin (and at the request's own stop strings)."""
        if self.logprobs:
            raise InvalidRequest(
                "logprobs are not supported on chat completions; use /v1/completions", param="logprobs"
            )
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if (turn_end := template.stop()) is not None:
            stops.append(turn_end)
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return CompletionRequest(
            **self.model_dump(include=_PASSED_ON),
            prompt=template.prompt(self.messages),
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            stop=stops or None,
        )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["length", "stop"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage
