"""OpenAI-compatible completions: a completion (JSON, or a stream of chunks), the model list and the model.

Stateless by default: each prompt starts from an empty memory. The extension field `session_id` continues an
existing session instead (the prompt and the completion become part of it, as with /generate); `memory` starts
each prompt from a preloaded memory (as if its document came first; nothing is stored).
`echo` + `logprobs` + `max_tokens: 0` scores a prompt.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from ...engine.device_report import DeviceReport
from ...settings import BUNDLED_MODEL_DIR, Settings
from ..shared.chat_template import ChatTemplateInfo
from ..shared.openai_errors import ModelNotFound
from ..shared.serving_info import ServingInfo
from ..shared.text_log import log_text
from .generation import Finished, Piece, completion_source
from .plan import Plan
from .protocol import (
    Completion,
    CompletionRequest,
    CompletionUsage,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    includes_usage,
)
from .sources import Sources
from .streaming import Envelope, event_stream


async def create_completion(body: CompletionRequest, sources: Sources) -> Any:
    """The completion's JSON, or its stream of chunks (with `stream`)."""
    plan = Plan.build(body, sources.model_id, sources.service.tokenizer, sources.settings)
    for text, _ in plan.prompts:
        log_text(sources.settings, "completion prompt", text)
    klass = sources.request_class(body.service_tier, choices=plan.n, max_tokens=plan.max_tokens)
    envelope = Envelope.new("cmpl-", sources.model_id, klass.tier.value)
    source = completion_source(body, plan, sources, klass)
    if body.stream:
        chunk = envelope.chunk("text_completion")
        return await event_stream(
            source, chunk, _text_chunks, include_usage=includes_usage(body.stream_options)
        )
    finished, usage = await collect(source)
    return Completion(
        id=envelope.id,
        created=envelope.created,
        model=envelope.model,
        choices=[item.choice(index) for index, item in finished],
        usage=usage,
        service_tier=envelope.service_tier,
    ).model_dump()


def _text_chunks(index: int, event: Piece | Finished) -> list[dict[str, Any]]:
    if isinstance(event, Piece):
        return [{"text": event.text, "index": index, "logprobs": event.logprobs, "finish_reason": None}]
    return [{"text": "", "index": index, "logprobs": None, "finish_reason": event.finish_reason}]


async def collect(
    source: AsyncGenerator[tuple[int, Piece | Finished], None],
) -> tuple[list[tuple[int, Finished]], CompletionUsage]:
    """A non-streamed response's finished choices (in index order) and its usage: the sums of each choice's
    prompt and completion tokens, as a streamed response's usage chunk counts them."""
    finished: dict[int, Finished] = {}
    async for index, item in source:
        if isinstance(item, Finished):
            finished[index] = item
    prompt = sum(item.prompt_tokens for item in finished.values())
    completion = sum(item.completion_tokens for item in finished.values())
    cached = sum(item.cached_tokens for item in finished.values())
    usage = CompletionUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )
    return sorted(finished.items()), usage


def list_models(
    report: DeviceReport | None, model_id: str, started_at: float, settings: Settings
) -> ModelList:
    """The one model this server serves, its chat template, and (once it is up) how its device serves it."""
    return ModelList(data=[_card(report, model_id, started_at, settings)])


def retrieve_model(
    model: str, report: DeviceReport | None, model_id: str, started_at: float, settings: Settings
) -> ModelCard:
    """The served model, if `model` names it."""
    if model != model_id:
        raise ModelNotFound(model, model_id)
    return _card(report, model_id, started_at, settings)


def _card(report: DeviceReport | None, model_id: str, started_at: float, settings: Settings) -> ModelCard:
    serving = ServingInfo.of(report) if report is not None else None
    chat = ChatTemplateInfo.of(settings)
    bundled = settings.model_dir.resolve() == BUNDLED_MODEL_DIR.resolve()
    return ModelCard(
        id=model_id, created=int(started_at), serving=serving, chat_template=chat, bundled=bundled
    )
