"""Chat completions on top of completions: the messages are written out with the server's chat template (see
`shared/chat_template.py`) and continued by the model; everything else is `/v1/completions`: the same sampling,
limits and stream. Without a template the route answers 404, saying how this server is used instead."""

from __future__ import annotations

from typing import Any

from ...errors import NotFound
from ..completions.generation import Finished, Piece, completion_source
from ..completions.plan import Plan
from ..completions.protocol import includes_usage
from ..completions.serving import collect
from ..completions.sources import Sources
from ..completions.streaming import Envelope, event_stream
from ..shared.chat_template import ChatTemplate
from ..shared.dependencies import AppSettings
from ..shared.text_log import log_text
from .logprobs import chat_logprobs
from .protocol import (
    DEFAULT_MAX_TOKENS,
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChoiceLogprobs,
)


def chat_template(settings: AppSettings) -> ChatTemplate:
    """404 before anything else when no template is in force (the request body does not matter then)."""
    if settings.chat_template is None:
        raise NotFound(
            "this server serves a base language model, which continues text rather than chats, and neither the "
            "model (its chat_template.json) nor the operator declares a chat template: use POST /v1/completions "
            "(the operator can enable /v1/chat/completions with TXL_CHAT_TEMPLATE)"
        )
    return ChatTemplate(settings.chat_template)


async def create_chat_completion(
    body: ChatCompletionRequest, template: ChatTemplate, sources: Sources
) -> Any:
    """The reply's JSON, or its stream of chunks (with `stream`)."""
    completion = body.to_completion(template)
    plan = Plan.build(
        completion,
        sources.model_id,
        sources.service.tokenizer,
        sources.settings,
        turn_end=template.stop(),
        default_max_tokens=DEFAULT_MAX_TOKENS,
    )
    assert isinstance(completion.prompt, str)
    log_text(sources.settings, "chat prompt", completion.prompt)
    klass = sources.request_class(completion.service_tier, choices=plan.n, max_tokens=plan.max_tokens)
    envelope = Envelope.new("chatcmpl-", sources.model_id, klass.tier.value)
    source = completion_source(completion, plan, sources, klass)
    if body.stream:
        chunk = envelope.chunk("chat.completion.chunk")
        return await event_stream(
            source, chunk, ChatDeltas(plan.top), include_usage=includes_usage(body.stream_options)
        )
    finished, usage = await collect(source)
    replies = [
        ChatChoice(
            index=index,
            message=AssistantMessage(content=item.text.lstrip()),
            finish_reason=item.reason,
            logprobs=chat_logprobs(item.logprobs, plan.top),
        )
        for index, item in finished
    ]
    return ChatCompletion(
        id=envelope.id,
        created=envelope.created,
        model=envelope.model,
        choices=replies,
        usage=usage,
        service_tier=envelope.service_tier,
    ).model_dump()


class ChatDeltas:
    """The chunks of a streamed chat: each choice opens with the assistant's role, then its text (without the
    leading whitespace, as a reply that is not streamed) with its tokens' log-probs (with `logprobs`), then its
    finish reason."""

    def __init__(self, top: int) -> None:
        self.top = top  # alternatives per token, with logprobs
        self.opened: set[int] = set()  # choices whose first chunk (the role) was sent
        self.speaking: set[int] = set()  # choices whose reply began

    def __call__(self, index: int, event: Piece | Finished) -> list[dict[str, Any]]:
        out = []
        if index not in self.opened:
            self.opened.add(index)
            out.append(_delta(index, {"role": "assistant", "content": ""}))
        if isinstance(event, Piece):
            text = event.text if index in self.speaking else event.text.lstrip()
            logprobs = chat_logprobs(event.logprobs, self.top)
            if text:
                self.speaking.add(index)
            if text or logprobs is not None:  # a token's log-probs even where its text was dropped
                out.append(_delta(index, {"content": text}, logprobs=logprobs))
        else:
            out.append(_delta(index, {}, event.reason))
        return out


def _delta(
    index: int, content: dict[str, str], finish: str | None = None, logprobs: ChoiceLogprobs | None = None
) -> dict[str, Any]:
    shown = logprobs.model_dump() if logprobs is not None else None
    return {"index": index, "delta": content, "logprobs": shown, "finish_reason": finish}
