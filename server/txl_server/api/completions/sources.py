"""What a completion request runs on: its tenant's sessions (with `session_id`) or no session, a preloaded memory
to start from (with `memory`), and the metrics it feeds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends

from ...admission.classes import RequestClass, request_class
from ...engine.state import ModelState
from ...metrics import Metrics
from ...sessions.service import SessionService
from ...sessions.stateless import PromptScores, StatelessService
from ...settings import Settings
from ..shared.dependencies import AppSettings, MetricsDep, ModelId, Service, Stateless, Tenant

# (prompt token ids, whether to score the prompt, top log-probs per position) -> its state and scores
Prefill = Callable[[list[int], bool, int], Awaitable[tuple[ModelState, PromptScores]]]


@dataclass(frozen=True)
class Sources:
    """What a completion request runs on: sessions (with `session_id`) or no session, for its tenant, and the
    metrics it feeds."""

    tenant: str
    settings: Settings
    service: SessionService
    stateless: StatelessService
    metrics: Metrics
    model_id: str

    def request_class(self, service_tier: str | None, *, choices: int, max_tokens: int) -> RequestClass:
        """The request's class (admission.classes): its tenant and tier, and what it decodes once its prompts
        are fed (`choices` rows per prompt of up to `max_tokens`), for the estimate of its first token."""
        klass = request_class(self.tenant, service_tier)
        klass.decode_rows, klass.decode_tokens = choices, max_tokens
        return klass

    def prefill(self, memory: str | None, klass: RequestClass) -> Prefill:
        """What a stateless prompt starts from: nothing, or a preloaded memory of the caller's."""
        if memory is None:
            return lambda tokens, logprobs, top: self.stateless.prefill(
                tokens, owner=self.tenant, logprobs=logprobs, top_logprobs=top, klass=klass
            )
        memories = self.service.memories
        return lambda tokens, logprobs, top: memories.prefill(
            self.tenant, memory, tokens, logprobs=logprobs, top_logprobs=top, klass=klass
        )


async def completion_sources(
    tenant: Tenant,
    settings: AppSettings,
    service: Service,
    stateless: Stateless,
    metrics: MetricsDep,
    model_id: ModelId,
) -> Sources:
    return Sources(tenant, settings, service, stateless, metrics, model_id)


CompletionSources = Annotated[Sources, Depends(completion_sources)]
