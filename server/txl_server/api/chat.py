"""OpenAI-compatible `POST /v1/chat/completions`, when the operator configures a chat template.

TXL Serve serves base language models: to them a chat is text to continue. With `TXL_CHAT_TEMPLATE` (e.g.
`transcript`) the messages are written out one after another (`User: Hi\\n`), the model continues the transcript
after the assistant's prefix (`Assistant:`), and the reply ends where the model begins the user's next turn
(`\\nUser:`, a stop string). Everything else is `/v1/completions`: the same sampling, limits and stream. Without a
template the route answers 404, saying how this server is used instead.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from ..errors import InvalidRequest, NotFound
from .common import AppSettings, EventStream, log_text
from .completions import CompletionSources, Finished, Piece, Plan, collect, completion_source, stream_choices
from .completions_protocol import MAX_LOGPROBS, MAX_N, CompletionRequest, CompletionUsage, StreamOptions
from .disconnect import watch_connection
from .json_body import JsonBodyRoute
from .openai_errors import OPENAI_ERROR_RESPONSES

router = APIRouter(tags=["openai"], responses=OPENAI_ERROR_RESPONSES, route_class=JsonBodyRoute)

DEFAULT_MAX_TOKENS = 256  # a reply, not a document: it usually ends earlier, at the user's next turn


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str = Field(..., min_length=1, max_length=64)
    content: str | list[ContentPart] | None = None

    def text(self, index: int) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if any(part.type != "text" for part in self.content):
            raise InvalidRequest("only text content is supported", param=f"messages.{index}.content")
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(BaseModel):
    # Unknown fields are ignored, as OpenAI clients send options this server has no use for.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    n: int | None = Field(1, ge=1, le=MAX_N)
    user: str | None = Field(None, max_length=256)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


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


class ChatTemplate:
    """Messages -> one prompt, and the stop string that ends the assistant's turn."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.prefix, self.suffix = template.split("{content}")

    def prompt(self, messages: list[ChatMessage]) -> str:
        turns = [
            self.template.format(role=m.role, Role=m.role.capitalize(), content=m.text(i))
            for i, m in enumerate(messages)
        ]
        return "".join(turns) + self.prefix.format(role="assistant", Role="Assistant").rstrip()

    def stop(self) -> str | None:
        """Where the user's next turn would begin: the end of a message and the start of the user's."""
        stop = self.suffix + self.prefix.format(role="user", Role="User").rstrip()
        return stop if stop.strip() else None


def chat_template(settings: AppSettings) -> ChatTemplate:
    """404 before anything else when no template is configured (the request body does not matter then)."""
    if settings.chat_template is None:
        raise NotFound(
            "this server serves a base language model, which continues text rather than chats: use "
            "POST /v1/completions (the operator can enable /v1/chat/completions with TXL_CHAT_TEMPLATE)"
        )
    return ChatTemplate(settings.chat_template)


Template = Annotated[ChatTemplate, Depends(chat_template)]


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE chunks with stream"}},
)
@watch_connection
async def create_chat_completion(
    body: ChatCompletionRequest, template: Template, sources: CompletionSources
) -> Any:
    """A reply to `messages`, written out with the server's chat template and continued by the model."""
    completion = _as_completion(body, template)
    plan = Plan.build(completion, sources.model_id, sources.service.tokenizer, sources.settings)
    assert isinstance(completion.prompt, str)
    log_text(sources.settings, "chat prompt", completion.prompt)
    chat_id, created = "chatcmpl-" + secrets.token_hex(12), int(time.time())
    source = completion_source(completion, plan, sources)
    if body.stream:
        first = await anext(source)  # errors before any output are HTTP errors
        return EventStream(_stream(first, source, chat_id, created, sources.model_id, body))
    finished, usage = await collect(source)
    replies = []
    for index, item in finished:
        reason: Literal["length", "stop"] = "stop" if item.finish_reason == "stop" else "length"
        message = AssistantMessage(content=item.text.lstrip())
        replies.append(ChatChoice(index=index, message=message, finish_reason=reason))
    return ChatCompletion(
        id=chat_id, created=created, model=sources.model_id, choices=replies, usage=usage
    ).model_dump()


def _as_completion(body: ChatCompletionRequest, template: ChatTemplate) -> CompletionRequest:
    if body.logprobs:
        raise InvalidRequest(
            "logprobs are not supported on chat completions; use /v1/completions", param="logprobs"
        )
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if (turn_end := template.stop()) is not None:
        stops.append(turn_end)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return CompletionRequest(
        model=body.model,
        prompt=template.prompt(body.messages),
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        stop=stops or None,
        stream=body.stream,
        stream_options=body.stream_options,
        seed=body.seed,
        n=body.n,
        user=body.user,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
    )


async def _stream(
    first: tuple[int, Any],
    source: AsyncGenerator[tuple[int, Any], None],
    chat_id: str,
    created: int,
    model: str,
    body: ChatCompletionRequest,
) -> AsyncIterator[str]:
    opened: set[int] = set()  # choices whose first chunk (the role) was sent
    speaking: set[int] = set()  # choices whose reply began: leading whitespace is dropped, as non-streamed

    def delta(index: int, content: dict[str, str], finish: str | None = None) -> dict[str, Any]:
        return {"index": index, "delta": content, "logprobs": None, "finish_reason": finish}

    def choices(index: int, event: Piece | Finished) -> list[dict[str, Any]]:
        out = []
        if index not in opened:
            opened.add(index)
            out.append(delta(index, {"role": "assistant", "content": ""}))
        if isinstance(event, Piece):
            text = event.text if index in speaking else event.text.lstrip()
            if text:
                speaking.add(index)
                out.append(delta(index, {"content": text}))
        else:
            out.append(delta(index, {}, "stop" if event.finish_reason == "stop" else "length"))
        return out

    envelope = {"id": chat_id, "object": "chat.completion.chunk", "created": created, "model": model}
    usage = body.stream_options is not None and body.stream_options.include_usage
    async for line in stream_choices(first, source, envelope, choices, include_usage=usage):
        yield line
