"""A completion's choices as they are generated: each yields (choice index, Piece) as its text arrives and
(choice index, Finished) as it ends, from no session (each prompt from an empty or preloaded memory, `n`
choices each) or from a session (one prompt, one choice, which becomes part of the session)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Literal

from ...admission.classes import RequestClass
from ...engine.state import ModelState
from ...sessions.events import GenerateResult, TokenEvent
from ...sessions.service import GenerateOutcome, SessionService
from ...sessions.stateless import PromptScores, StatelessService, merge
from ..shared.timing import TokenTiming, timed
from .logprobs import LogprobsBuilder
from .plan import Plan
from .protocol import CompletionChoice, CompletionLogprobs, CompletionRequest
from .sources import Prefill, Sources


class Piece:
    """Text of one choice as it is produced: its echoed prompt (`generated` False), then each token."""

    def __init__(self, text: str, logprobs: dict[str, Any] | None, *, generated: bool) -> None:
        self.text, self.logprobs, self.generated = text, logprobs, generated


class Finished:
    def __init__(
        self,
        text: str,
        finish_reason: str,
        logprobs: CompletionLogprobs | None,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
    ) -> None:
        self.text, self.finish_reason, self.logprobs = text, finish_reason, logprobs
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens
        self.cached_tokens = cached_tokens  # of the prompt's, from the prefix cache

    @property
    def reason(self) -> Literal["length", "stop"]:
        """The finish reason as OpenAI names it."""
        return "stop" if self.finish_reason == "stop" else "length"

    def choice(self, index: int) -> CompletionChoice:
        return CompletionChoice(
            text=self.text, index=index, logprobs=self.logprobs, finish_reason=self.reason
        )


def completion_source(
    body: CompletionRequest, plan: Plan, sources: Sources, klass: RequestClass
) -> AsyncGenerator[tuple[int, Piece | Finished], None]:
    """(choice index, Piece) as text is produced, and (choice index, Finished) as each choice ends; time to
    first token and inter-token latency are observed on the way. `klass`: the request's class, for admission."""
    if body.session_id is not None:
        source = _session_completion(sources.service, sources.tenant, body, plan, klass)
    else:
        prefill = sources.prefill(body.memory, klass)
        source = _stateless_completions(sources.stateless, body, plan, prefill, klass)
    return timed(source, TokenTiming(sources.metrics), _generated_choice)


def _generated_choice(item: tuple[int, Piece | Finished]) -> int | None:
    index, event = item
    return index if isinstance(event, Piece) and event.generated else None


async def _stateless_completions(
    stateless: StatelessService, body: CompletionRequest, plan: Plan, prefill: Prefill, klass: RequestClass
) -> AsyncGenerator[tuple[int, Any], None]:
    scored = bool(body.echo and body.logprobs is not None)
    prefilled = await _prefill_all(prefill, [ids for _, ids in plan.prompts], scored, plan.top)
    try:
        streams = []
        for (prompt_text, _), (state, scores) in zip(plan.prompts, prefilled, strict=True):
            for i in range(plan.n):
                generation = stateless.generate(
                    state,
                    max_tokens=plan.max_tokens,
                    sampling=plan.sampling[i],
                    stop=plan.stops,
                    top_logprobs=plan.top,
                    klass=klass,
                )
                streams.append(_choice(generation, prompt_text, scores, body, plan))
        async for index, item in merge(streams):
            yield index, item
    finally:  # the prompts' states go back to the device's pool (each generation held its own)
        for state, _ in prefilled:
            state.release()


async def _prefill_all(
    prefill: Prefill, prompts: list[list[int]], scored: bool, top: int
) -> list[tuple[ModelState, PromptScores]]:
    """Every prompt's prefill at once, so that the scheduler batches their chunks (lm-eval sends 16 to 64 prompts
    in a request); the first error stops the others and is the request's."""
    tasks = [asyncio.ensure_future(prefill(ids, scored, top)) for ids in prompts]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        for done in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(done, tuple):  # a prompt that was read: its state goes back
                done[0].release()
        raise


async def _session_completion(
    service: SessionService, tenant: str, body: CompletionRequest, plan: Plan, klass: RequestClass
) -> AsyncGenerator[tuple[int, Any], None]:
    assert body.session_id is not None
    prompt_text, prompt_ids = plan.prompts[0]
    generation = service.generate(
        tenant,
        body.session_id,
        prompt_tokens=prompt_ids,
        max_tokens=plan.max_tokens,
        sampling=plan.sampling[0],
        stop=plan.stops,
        top_logprobs=plan.top,
        klass=klass,
    )
    scores = PromptScores(prompt_ids, [], None)  # session mode: no prompt log-probs
    async for item in _choice(generation, prompt_text, scores, body, plan):
        yield 0, item


async def _choice(
    generation: AsyncGenerator[Any, None],
    prompt_text: str,
    scores: PromptScores,
    body: CompletionRequest,
    plan: Plan,
) -> AsyncGenerator[Any, None]:
    """One choice as Pieces (with their log-probs and offsets in the choice's text), then its Finished."""
    logprobs = LogprobsBuilder(plan.tokenizer, plan.top) if body.logprobs is not None else None
    try:
        if body.echo:
            if logprobs is not None:
                logprobs.add_prompt(scores)
            yield Piece(prompt_text, logprobs.build().model_dump() if logprobs else None, generated=False)
        async for item in generation:
            if isinstance(item, TokenEvent):
                chunk = None
                if logprobs is not None:
                    logprobs.add(item.id, item.text, item.logprob, item.top)
                    chunk = logprobs.build(len(logprobs.tokens) - 1).model_dump()
                yield Piece(item.text, chunk, generated=True)
            else:
                result: GenerateResult = item.result if isinstance(item, GenerateOutcome) else item
                text = (prompt_text if body.echo else "") + result.text
                yield Finished(
                    text,
                    result.finish_reason,
                    logprobs.build() if logprobs is not None else None,
                    len(scores.token_ids),
                    result.completion_tokens,
                    scores.cached_tokens,
                )
    finally:
        await generation.aclose()
