"""The OpenAI completions protocol: what `POST /v1/completions` and `GET /v1/models` take and return (pydantic, at
the edge only), and its conversion to the engine's sampling parameters."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from txl.sampling import SamplingParams

from ..shared.limits import MAX_MEMORY_ID_CHARS, MAX_USER_CHARS, MaxTokens, Seed
from ..shared.serving_info import ServingInfo

MAX_N = 8
MAX_LOGPROBS = 5


class StreamOptions(BaseModel):
    include_usage: bool = False


def includes_usage(options: StreamOptions | None) -> bool:
    """Whether a stream ends with a usage chunk."""
    return options is not None and options.include_usage


class CompletionRequest(BaseModel):
    # Unknown fields are ignored, as OpenAI clients send options this server has no use for.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]] = ""
    max_tokens: MaxTokens | None = 16
    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = False
    seed: Seed | None = None
    n: int | None = Field(1, ge=1, le=MAX_N)
    user: str | None = Field(None, max_length=MAX_USER_CHARS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    suffix: str | None = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    session_id: str | None = Field(None, description="Extension: continue (and advance) this session")
    memory: str | None = Field(
        None,
        max_length=MAX_MEMORY_ID_CHARS,
        description="Extension: complete the prompt as if this preloaded memory's document came first",
    )

    def to_sampling_params(self) -> list[SamplingParams]:
        """One set of sampling parameters per choice (`n`); choice i draws from seed + i, when seeded."""
        temperature = 1.0 if self.temperature is None else self.temperature
        top_p = 1.0 if self.top_p is None else self.top_p
        return [
            SamplingParams(
                temperature=temperature, top_p=top_p, seed=None if self.seed is None else self.seed + i
            )
            for i in range(self.n or 1)
        ]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["length", "stop"] | None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="Prompt tokens read from the prefix cache instead of computed")


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "txl-serve"
    serving: ServingInfo | None = Field(None, description="Extension: the device and how it serves the model")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
