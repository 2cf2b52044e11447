"""The OpenAI completions protocol: what `POST /v1/completions` and `GET /v1/models` take and return (pydantic, at
the edge only), and its conversion to the engine's sampling parameters."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from txl.sampling import SamplingParams

from ..shared.chat_template import ChatTemplateInfo
from ..shared.limits import (
    MAX_MEMORY_ID_CHARS,
    MAX_USER_CHARS,
    MaxTokens,
    Seed,
    StopStrings,
    Text,
    TokenIds,
)
from ..shared.request_body import RequestBody
from ..shared.service_tier import SERVED_TIER, SERVICE_TIER, RequestedTier, ServedTier
from ..shared.serving_info import ServingInfo

MAX_N = 8  # choices per prompt (`n`)
# Prompts in one request, and choices in all (prompts x n): as many as lm-evaluation-harness sends in one batch
# (its --batch_size, 16 to 64); what they hold is bounded by the body's size (TXL_MAX_BODY_BYTES).
MAX_PROMPTS = 64
MAX_CHOICES = 64
MAX_LOGPROBS = 5
DEFAULT_MAX_TOKENS = 16  # OpenAI's
# A penalty this server does not apply: the schema accepts only 0 (`Plan.build` refuses the rest, saying so).
NOT_SUPPORTED_BUT_0: dict[str, Any] = {"minimum": 0, "maximum": 0, "description": "Not supported: only 0"}

Prompts = Annotated[list[Text], Field(max_length=MAX_PROMPTS)]
PromptsOfTokenIds = Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


def includes_usage(options: StreamOptions | None) -> bool:
    """Whether a stream ends with a usage chunk."""
    return options is not None and options.include_usage


class CompletionRequest(RequestBody):
    # Unknown fields are ignored, as OpenAI clients send options this server has no use for.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = None
    # Several prompts first: an error names what is wrong with the list, not that it is not a string.
    prompt: Prompts | TokenIds | PromptsOfTokenIds | Text = ""
    max_tokens: MaxTokens | None = DEFAULT_MAX_TOKENS
    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(1.0, gt=0, le=1)
    stop: StopStrings = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: StrictBool | None = False
    seed: Seed | None = None
    n: int | None = Field(1, ge=1, le=MAX_N)
    user: str | None = Field(None, max_length=MAX_USER_CHARS)
    # Accepted only where they change nothing (`Plan.build` refuses the rest, saying so):
    best_of: int | None = Field(None, ge=1, le=MAX_N, description="Only equal to n")
    suffix: str | None = Field(
        None, json_schema_extra={"maxLength": 0}, description="Not supported: only empty"
    )
    frequency_penalty: float | None = Field(None, ge=-2, le=2, json_schema_extra=NOT_SUPPORTED_BUT_0)
    presence_penalty: float | None = Field(None, ge=-2, le=2, json_schema_extra=NOT_SUPPORTED_BUT_0)
    session_id: str | None = Field(None, description="Extension: continue (and advance) this session")
    memory: str | None = Field(
        None,
        max_length=MAX_MEMORY_ID_CHARS,
        description="Extension: complete the prompt as if this preloaded memory's document came first",
    )
    service_tier: RequestedTier | None = SERVICE_TIER

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
    service_tier: ServedTier | None = SERVED_TIER


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "txl-serve"
    serving: ServingInfo | None = Field(None, description="Extension: the device and how it serves the model")
    chat_template: ChatTemplateInfo | None = Field(
        None,
        description="Extension: the chat template of /v1/chat/completions and message input, and where it comes "
        "from; null: none (chat answers 404)",
    )
    bundled: bool = Field(
        False,
        description="Extension: the demonstration model bundled with the server (13.8 MB: it shows the API at "
        "work, its text makes little sense; --model serves a real checkpoint)",
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
