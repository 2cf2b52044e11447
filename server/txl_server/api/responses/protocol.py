"""The OpenAI Responses protocol as this server speaks it: what `POST /v1/responses` takes (pydantic, at the edge
only), the response object and its input items. (Its errors are OpenAI's: `shared/openai_errors.py`.)"""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from txl.sampling import SamplingParams

from ...errors import InvalidRequest
from ..shared.chat_template import ChatMessage, Role
from ..shared.limits import MAX_USER_CHARS, MaxTokens, Seed, StopStrings, Text
from ..shared.request_body import RequestBody
from ..shared.service_tier import SERVICE_TIER, RequestedTier, ServedTier

DEFAULT_MAX_OUTPUT_TOKENS = 256  # as chat completions: a reply, not a document
MAX_INPUT_ITEMS = 256
MAX_TOP_LOGPROBS = 20  # as OpenAI's
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the one `include` this server has anything for
# OpenAI's limits on metadata: 16 pairs, keys of at most 64 characters, values of at most 512.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
TEXT_PARTS = ("input_text", "output_text", "text")


def item_id(kind: str = "msg") -> str:
    return f"{kind}_{secrets.token_hex(16)}"


# ---------------------------------------------------------------------------------------------- requests


class InputContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # Other kinds of content (images, files) are refused with their reason (`messages`).
    type: str = Field(..., max_length=64, json_schema_extra={"enum": list(TEXT_PARTS)})
    text: str = ""


class InputItem(BaseModel):
    """A message (`{"role", "content"}`, `type` "message" or left out): the only kind of item supported."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["message"] = "message"
    role: Role
    content: str | list[InputContentPart]


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = Field("text", max_length=64, json_schema_extra={"enum": ["text"]})


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat | None = None


MetadataKey = Annotated[str, Field(max_length=MAX_METADATA_KEY)]
MetadataValue = Annotated[str, Field(max_length=MAX_METADATA_VALUE)]
InputItems = Annotated[list[InputItem], Field(min_length=1, max_length=MAX_INPUT_ITEMS)]
ConversationId = Annotated[str, Field(max_length=256)]


class ConversationParam(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: ConversationId


class ResponseCreateRequest(RequestBody):
    # Unknown fields are ignored, as OpenAI clients send options this server has no use for.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = None
    # Messages first: an error names what is wrong with an item, not that the input is not a string.
    input: InputItems | Text = Field(
        "", description="A string (continued verbatim) or messages (written out with TXL_CHAT_TEMPLATE)"
    )
    instructions: Text | None = Field(None, description="Fed before this turn's input (and stays in memory)")
    previous_response_id: str | None = Field(None, max_length=256)
    store: StrictBool | None = True
    stream: StrictBool | None = False
    max_output_tokens: MaxTokens | None = Field(None, description="Default 256, or the server's most")
    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(1.0, gt=0, le=1)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(None, max_length=MAX_METADATA_PAIRS)
    truncation: Literal["auto", "disabled"] | None = Field(
        None,
        description="auto (the default here): the memory's window slides past the oldest positions, as it "
        "always does; disabled: a turn whose conversation would outgrow the window fails instead",
    )
    user: str | None = Field(None, max_length=MAX_USER_CHARS)
    # Accepted only empty or off; the schema says so, and `refuse_unsupported` refuses the rest with its reason:
    tools: list[Any] | None = Field(None, json_schema_extra={"maxItems": 0})
    background: StrictBool | None = Field(None, description="Answer at once; poll, stream again or cancel")
    conversation: ConversationId | ConversationParam | None = Field(
        None, description="A conversation (its id): the turn continues it, and its items are added to it"
    )
    include: list[Annotated[str, Field(max_length=64)]] | None = Field(
        None, max_length=8, json_schema_extra={"items": {"enum": [LOGPROBS_INCLUDE], "type": "string"}}
    )
    text: TextConfig | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # This server's extensions (the Sessions API's sampling): ignored by other servers, as Open Responses allows.
    top_k: int | None = Field(None, ge=0, description="Extension: sample from the k likeliest (0: no limit)")
    seed: Seed | None = Field(
        None, description="Extension: the sampling's seed (the same seed, the same text)"
    )
    stop: StopStrings = Field(None, description="Extension: the reply ends before the first of these")
    service_tier: RequestedTier | None = SERVICE_TIER

    @property
    def conversation_id(self) -> str | None:
        if isinstance(self.conversation, ConversationParam):
            return self.conversation.id
        return self.conversation

    @property
    def logprobs(self) -> bool:
        """Whether the output text carries its tokens' log-probs (`include`, or `top_logprobs` asked for)."""
        return LOGPROBS_INCLUDE in (self.include or []) or bool(self.top_logprobs)

    def refuse_unsupported(self) -> None:
        if self.tools:
            raise InvalidRequest("tools are not supported", param="tools")
        if self.conversation is not None and self.previous_response_id is not None:
            # OpenAI's answer: a turn continues either a conversation or a response, not both.
            raise InvalidRequest(
                "conversation and previous_response_id cannot be used together", param="conversation"
            )
        for i, value in enumerate(self.include or []):
            if value != LOGPROBS_INCLUDE:
                raise InvalidRequest(
                    f"include {value!r} is not supported; only {LOGPROBS_INCLUDE!r}", param=f"include.{i}"
                )
        if self.text is not None and self.text.format is not None and self.text.format.type != "text":
            raise InvalidRequest("only the text format is supported", param="text.format")

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
        )

    def messages(self) -> list[ChatMessage]:
        """The input's messages (a list input), their text checked."""
        assert isinstance(self.input, list)
        out = []
        for i, item in enumerate(self.input):
            parts = [item.content] if isinstance(item.content, str) else item.content
            texts = []
            for part in parts:
                if isinstance(part, InputContentPart):
                    if part.type not in TEXT_PARTS:
                        raise InvalidRequest("only text content is supported", param=f"input.{i}.content")
                    part = part.text
                texts.append(part or "")
            out.append(ChatMessage(role=item.role, content="".join(texts)))
        return out


# ---------------------------------------------------------------------------------------------- answers


class TopTokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopTokenLogprob):
    top_logprobs: list[TopTokenLogprob]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[TokenLogprob] = Field(
        default_factory=list, description="With include message.output_text.logprobs: each token's"
    )


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]  # empty while the item is being added, as Open Responses shows it


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(..., description="Positions of the context served from memory, not fed again")
    cache_write_tokens: int = Field(..., description="Input tokens kept in memory for a chained turn")


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int = Field(..., description="This turn's input tokens plus cached_tokens")
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, *, fed: int, cached: int, output: int, stored: bool) -> ResponseUsage:
        return cls(
            input_tokens=fed + cached,
            input_tokens_details=InputTokensDetails(
                cached_tokens=cached, cache_write_tokens=fed if stored else 0
            ),
            output_tokens=output,
            total_tokens=fed + cached + output,
        )


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


class ConversationRef(BaseModel):
    id: str


ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
TERMINAL = ("completed", "incomplete", "failed", "cancelled")


class ResponseObject(BaseModel):
    id: str = Field(..., description="resp_{session id}.{version}: a session and its version after the turn")
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: ResponseStatus
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int
    metadata: dict[str, str]
    model: str
    output: list[OutputMessage]
    parallel_tool_calls: bool = False
    previous_response_id: str | None
    store: bool
    temperature: float
    top_p: float
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Literal["none"] = "none"
    tools: list[Any] = Field(default_factory=list)
    truncation: Literal["disabled", "auto"] = "auto"
    background: bool = False
    conversation: ConversationRef | None = None
    usage: ResponseUsage | None = None
    user: str | None = None
    # Open Responses requires these of every response; this server has one value for each.
    top_logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    reasoning: None = None
    max_tool_calls: None = None
    service_tier: ServedTier = "default"
    safety_identifier: None = None
    prompt_cache_key: None = None


class InputContent(BaseModel):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None


class InputMessageItem(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    status: Literal["completed"] = "completed"
    content: list[InputContent]

    @classmethod
    def of(cls, role: str, text: str) -> InputMessageItem:
        if role == "assistant":  # an earlier reply given back: OpenAI lists it as output text
            return cls(id=item_id(), role="assistant", content=[InputContent(type="output_text", text=text)])
        return cls(id=item_id(), role=role, content=[InputContent(type="input_text", text=text)])


class InputItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[InputMessageItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True
