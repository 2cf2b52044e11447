"""The OpenAI Responses protocol as this server speaks it: what `POST /v1/responses` takes (pydantic, at the edge
only), the response object and its input items, and a turn's text: a string input continued verbatim, or messages
written out with the chat template (TXL_CHAT_TEMPLATE), as chat completions are."""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from txl.sampling import SamplingParams

from ..errors import InvalidRequest
from ..sessions.store.responses import ResponseRecord
from .chat import ChatMessage, ChatTemplate

DEFAULT_MAX_OUTPUT_TOKENS = 256  # as chat completions: a reply, not a document
MAX_INPUT_ITEMS = 256
# OpenAI's limits on metadata: 16 pairs, keys of at most 64 characters, values of at most 512.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")


def item_id(kind: str = "msg") -> str:
    return f"{kind}_{secrets.token_hex(16)}"


# ---------------------------------------------------------------------------------------------- requests


class InputContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = Field(..., max_length=64)
    text: str | None = None


class InputItem(BaseModel):
    """A message (`{"role", "content"}`, `type` "message" or left out); other kinds of items are refused."""

    model_config = ConfigDict(extra="ignore")
    type: str = Field("message", max_length=64)
    role: str | None = Field(None, max_length=64)
    content: str | list[InputContentPart] | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = Field("text", max_length=64)


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat | None = None


class ResponseCreateRequest(BaseModel):
    # Unknown fields are ignored, as OpenAI clients send options this server has no use for.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = None
    input: str | list[InputItem] = Field(
        "", description="A string (continued verbatim) or messages (written out with TXL_CHAT_TEMPLATE)"
    )
    instructions: str | None = Field(None, description="Fed before this turn's input (and stays in memory)")
    previous_response_id: str | None = Field(None, max_length=256)
    store: bool | None = True
    stream: bool | None = False
    max_output_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(1.0, gt=0, le=1)
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = Field(
        None, description="Accepted and never needed: the memory is bounded by mem_len"
    )
    user: str | None = Field(None, max_length=256)
    # Refused unless empty or off (see `refuse_unsupported`):
    tools: list[Any] | None = None
    background: bool | None = None
    conversation: Any = None
    text: TextConfig | None = None
    top_logprobs: int | None = Field(None, ge=0)

    def refuse_unsupported(self) -> None:
        if self.tools:
            raise InvalidRequest("tools are not supported", param="tools")
        if self.background:
            raise InvalidRequest("background responses are not supported", param="background")
        if self.conversation is not None:
            raise InvalidRequest(
                "conversations are not supported; chain with previous_response_id", param="conversation"
            )
        if self.text is not None and self.text.format is not None and self.text.format.type != "text":
            raise InvalidRequest("only the text format is supported", param="text.format")
        if self.top_logprobs:
            raise InvalidRequest("top_logprobs is not supported on responses", param="top_logprobs")
        if isinstance(self.input, list) and not 1 <= len(self.input) <= MAX_INPUT_ITEMS:
            raise InvalidRequest(f"input must hold 1 to {MAX_INPUT_ITEMS} items", param="input")
        metadata = self.metadata or {}
        if len(metadata) > MAX_METADATA_PAIRS or any(
            len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE for k, v in metadata.items()
        ):
            raise InvalidRequest(
                f"metadata holds at most {MAX_METADATA_PAIRS} pairs, keys of at most {MAX_METADATA_KEY} "
                f"characters and values of at most {MAX_METADATA_VALUE}",
                param="metadata",
            )

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
        )

    def messages(self) -> list[ChatMessage]:
        """The input's messages (a list input), their text checked."""
        assert isinstance(self.input, list)
        out = []
        for i, item in enumerate(self.input):
            if item.type != "message":
                raise InvalidRequest(
                    f"input items of type {item.type!r} are not supported (only messages)",
                    param=f"input.{i}.type",
                )
            if item.role not in ROLES:
                raise InvalidRequest(f"role must be one of {', '.join(ROLES)}", param=f"input.{i}.role")
            parts = [item.content] if isinstance(item.content, str | None) else item.content
            texts = []
            for part in parts:
                if isinstance(part, InputContentPart):
                    if part.type not in TEXT_PARTS:
                        raise InvalidRequest("only text content is supported", param=f"input.{i}.content")
                    part = part.text
                texts.append(part or "")
            out.append(ChatMessage(role=item.role, content="".join(texts)))
        return out


# ---------------------------------------------------------------------------------------------- a turn's text


def turn_text(
    body: ResponseCreateRequest, template: ChatTemplate | None, previous: ResponseRecord | None
) -> tuple[str, list[ChatMessage] | None]:
    """What the turn feeds, and its messages (None for a string input).

    A string is fed verbatim after the instructions, as a continuation. Messages are written out with the chat
    template after the instructions (as a system message), up to the assistant's prefix. After a turn of
    messages, the memory ends inside the conversation: where the model began the user's next turn (its prefix is
    then not written again), or inside its own reply, cut at max_output_tokens (which is then closed)."""
    if isinstance(body.input, str):
        return (body.instructions or "") + body.input, None
    if template is None:
        raise InvalidRequest(
            "message input needs a chat template, and this server has none: the operator sets "
            "TXL_CHAT_TEMPLATE (e.g. transcript); or send input as a string, which the model continues",
            param="input",
        )
    messages = body.messages()
    if body.instructions is not None:
        messages.insert(0, ChatMessage(role="system", content=body.instructions))
    text = template.prompt(messages)
    if previous is None or not previous.messages:
        return text, messages
    if not previous.turn_end:
        return template.suffix.format(role="assistant", Role="Assistant") + text, messages
    user = template.template.format(role="user", Role="User", content="")  # an empty user message
    written = template.prefix.format(role="user", Role="User").rstrip()  # what the model wrote of it
    if messages[0].role != "user":  # the user's turn the model began is closed, empty
        text = user + text
    return text[len(written) :], messages


# ---------------------------------------------------------------------------------------------- answers


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


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


class ResponseObject(BaseModel):
    id: str = Field(..., description="resp_{session id}.{version}: a session and its version after the turn")
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: None = None
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
    truncation: Literal["disabled", "auto"] = "disabled"
    background: bool = False
    usage: ResponseUsage | None = None
    user: str | None = None


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


def input_items(body: ResponseCreateRequest, messages: list[ChatMessage] | None) -> list[dict[str, Any]]:
    """The turn's input as OpenAI lists it: a string is one user message (instructions are not items)."""
    if messages is None:
        assert isinstance(body.input, str)
        return [InputMessageItem.of("user", body.input).model_dump(exclude_none=True)]
    given = messages[1:] if body.instructions is not None else messages
    return [InputMessageItem.of(m.role, m.text(i)).model_dump(exclude_none=True) for i, m in enumerate(given)]


class InputItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[InputMessageItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ResponsesErrorDetail(BaseModel):
    type: str = Field(
        ..., description="invalid_request_error for previous_response_not_found, else as elsewhere"
    )
    message: str
    param: str | None
    code: str | None = Field(None, description="previous_response_not_found: resend the whole conversation")


class ResponsesErrorBody(BaseModel):
    error: ResponsesErrorDetail


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True
