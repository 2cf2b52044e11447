"""OpenAI-compatible `POST /v1/completions` (and `GET /v1/models`), usable by the official `openai` client.

Stateless by default: each prompt starts from an empty memory. The extension field `session_id` continues an
existing session instead (the prompt and the completion become part of it, as with /generate); `memory` starts
each prompt from a preloaded memory (as if its document came first; nothing is stored).
`echo` + `logprobs` + `max_tokens: 0` scores a prompt.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from txl.sampling import SamplingParams
from txl.tokenizers import Tokenizer

from ..engine.state import ModelState
from ..errors import InvalidRequest, ServiceError
from ..metrics import Metrics
from ..sessions.events import GenerateResult, TokenEvent, TopLogprobs
from ..sessions.service import GenerateOutcome, SessionService
from ..sessions.stateless import PromptScores, StatelessService, merge
from ..settings import Settings
from . import sse
from .common import (
    AppSettings,
    EventStream,
    MetricsDep,
    ModelId,
    Service,
    Stateless,
    Tenant,
    TokenTiming,
    check_max_tokens,
    check_stop,
    check_text,
    log_text,
)
from .completions_protocol import (
    MAX_N,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionUsage,
    ModelCard,
    ModelList,
    PromptTokensDetails,
)
from .disconnect import watch_connection
from .json_body import JsonBodyRoute
from .openai_errors import OPENAI_ERROR_RESPONSES, ModelNotFound, stream_error
from .system_protocol import ServingInfo

router = APIRouter(tags=["openai"], responses=OPENAI_ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request, tenant: Tenant, model_id: ModelId) -> ModelList:
    report = request.app.state.runtime.device_report()
    serving = ServingInfo.of(report) if report is not None else None
    return ModelList(
        data=[ModelCard(id=model_id, created=int(request.app.state.started_at), serving=serving)]
    )


@router.post(
    "/v1/completions",
    response_model=Completion,
    responses={200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE chunks with stream"}},
)
@watch_connection
async def create_completion(body: CompletionRequest, sources: CompletionSources) -> Any:
    plan = Plan.build(body, sources.model_id, sources.service.tokenizer, sources.settings)
    for text, _ in plan.prompts:
        log_text(sources.settings, "completion prompt", text)
    completion_id, created = "cmpl-" + secrets.token_hex(12), int(time.time())
    source = completion_source(body, plan, sources)
    if body.stream:
        first = await anext(source)  # errors before any output are HTTP errors
        return EventStream(_stream(first, source, completion_id, created, sources.model_id, body))
    finished, usage = await collect(source)
    return Completion(
        id=completion_id,
        created=created,
        model=sources.model_id,
        choices=[item.choice(index) for index, item in finished],
        usage=usage,
    ).model_dump()


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


def completion_sources(
    tenant: Tenant,
    settings: AppSettings,
    service: Service,
    stateless: Stateless,
    metrics: MetricsDep,
    model_id: ModelId,
) -> Sources:
    return Sources(tenant, settings, service, stateless, metrics, model_id)


CompletionSources = Annotated[Sources, Depends(completion_sources)]


def completion_source(
    body: CompletionRequest, plan: Plan, sources: Sources
) -> AsyncGenerator[tuple[int, Piece | Finished], None]:
    """(choice index, Piece) as text is produced, and (choice index, Finished) as each choice ends; time to
    first token and inter-token latency are observed on the way."""
    if body.session_id is not None:
        source = _session_completion(sources.service, sources.tenant, body, plan)
    else:
        source = _stateless_completions(sources.stateless, body, plan, _prefill(sources, body.memory))
    return _timed(source, TokenTiming(sources.metrics))


Prefill = Callable[[list[int], bool, int], Awaitable[tuple[ModelState, PromptScores]]]


def _prefill(sources: Sources, memory: str | None) -> Prefill:
    """What a stateless prompt starts from: nothing, or a preloaded memory of the caller's."""
    if memory is None:
        return lambda tokens, logprobs, top: sources.stateless.prefill(
            tokens, owner=sources.tenant, logprobs=logprobs, top_logprobs=top
        )
    memories = sources.service.memories
    return lambda tokens, logprobs, top: memories.prefill(
        sources.tenant, memory, tokens, logprobs=logprobs, top_logprobs=top
    )


# ---------------------------------------------------------------------------------------------- planning


class Plan:
    """The validated request: prompts as token ids, sampling, and what to report."""

    def __init__(
        self,
        prompts: list[tuple[str, list[int]]],
        n: int,
        sampling: list[SamplingParams],
        stops: list[str],
        max_tokens: int,
        top: int,
        tokenizer: Tokenizer,
    ) -> None:
        self.prompts, self.n, self.sampling, self.stops = prompts, n, sampling, stops
        self.max_tokens, self.top, self.tokenizer = max_tokens, top, tokenizer

    @classmethod
    def build(cls, body: CompletionRequest, model_id: str, tokenizer: Tokenizer, settings: Settings) -> Plan:
        if body.model is not None and body.model != model_id:
            raise ModelNotFound(body.model, model_id)
        if body.suffix:
            raise InvalidRequest("suffix is not supported", param="suffix")
        if body.best_of not in (None, body.n or 1):
            raise InvalidRequest("best_of other than n is not supported", param="best_of")
        for penalty in ("frequency_penalty", "presence_penalty"):
            if getattr(body, penalty):
                raise InvalidRequest(f"{penalty} is not supported (only 0)", param=penalty)
        prompts = cls._prompts(body.prompt, tokenizer, settings)
        if body.session_id is not None and body.memory is not None:
            raise InvalidRequest("give session_id or memory, not both", param="memory")
        if body.session_id is not None and len(prompts) != 1:
            raise InvalidRequest("with session_id, give a single prompt", param="prompt")
        max_tokens = 16 if body.max_tokens is None else body.max_tokens
        check_max_tokens(settings, max_tokens)
        n = body.n or 1
        if body.session_id is not None and n != 1:
            raise InvalidRequest("with session_id, n must be 1", param="n")
        if len(prompts) * n > MAX_N:
            raise InvalidRequest(f"prompts x n must be at most {MAX_N}", param="n")
        return cls(
            prompts,
            n,
            body.to_sampling_params(),
            check_stop(settings, body.stop),
            max_tokens,
            body.logprobs or 0,
            tokenizer,
        )

    @staticmethod
    def _prompts(prompt: Any, tokenizer: Tokenizer, settings: Any) -> list[tuple[str, list[int]]]:
        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            items = [prompt]
        else:
            items = list(prompt) or [""]
        out = []
        for item in items:
            if isinstance(item, str):
                check_text(settings, item, "prompt")
                out.append((item, tokenizer.encode(item)))
            else:
                if any(not 0 <= t < tokenizer.vocab_size for t in item):
                    raise InvalidRequest(f"token ids must be in [0, {tokenizer.vocab_size})", param="prompt")
                if len(item) > settings.max_text_chars:
                    raise InvalidRequest("prompt has too many tokens", param="prompt")
                out.append((tokenizer.decode(item), list(item)))
        return out


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

    def choice(self, index: int) -> CompletionChoice:
        reason: Literal["length", "stop"] = "stop" if self.finish_reason == "stop" else "length"
        return CompletionChoice(text=self.text, index=index, logprobs=self.logprobs, finish_reason=reason)


class _LogprobsBuilder:
    """OpenAI's `logprobs` object: token strings, their log-probs, top alternatives and text offsets.

    As OpenAI's: an echoed prompt's first token has null for its log-prob and its alternatives (nothing before
    it is part of the prompt), and a token's alternatives hold the token itself when it is not among the top
    `logprobs` (so they may hold one more)."""

    def __init__(self, tokenizer: Tokenizer, top: int) -> None:
        self.tokenizer, self.top = tokenizer, top
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []
        self.offset = 0

    def add(self, token_id: int, text: str, logprob: float | None, top: TopLogprobs | None) -> None:
        self.tokens.append(text)
        self.token_logprobs.append(logprob)
        alternatives = None
        if top is not None:
            alternatives = {self.tokenizer.token_text(t): lp for t, lp in top}
            if logprob is not None and all(t != token_id for t, _ in top):
                alternatives[self.tokenizer.token_text(token_id)] = logprob
        self.top_logprobs.append(alternatives)
        self.text_offset.append(self.offset)
        self.offset += len(text)

    def add_prompt(self, scores: PromptScores) -> None:
        decoder = self.tokenizer.decoder()
        pieces = [decoder.push(t) for t in scores.token_ids]
        if pieces:
            pieces[-1] += decoder.flush()
        for i, (token_id, piece) in enumerate(zip(scores.token_ids, pieces, strict=True)):
            if i == 0:
                self.add(token_id, piece, None, None)
                continue
            logprob = scores.logprobs[i] if i < len(scores.logprobs) else None
            alternatives = scores.top[i] if (scores.top is not None and i < len(scores.top)) else None
            self.add(token_id, piece, logprob, alternatives)

    def build(self, start: int = 0) -> CompletionLogprobs:
        """The entries from `start` on (a streamed chunk's), or all of them."""
        return CompletionLogprobs(
            tokens=self.tokens[start:],
            token_logprobs=self.token_logprobs[start:],
            top_logprobs=self.top_logprobs[start:] if self.top else None,
            text_offset=self.text_offset[start:],
        )


# ---------------------------------------------------------------------------------------------- sources
# Each yields (choice index, Piece) as text arrives and (choice index, Finished) as the choice ends.


async def _stateless_completions(
    stateless: StatelessService, body: CompletionRequest, plan: Plan, prefill: Prefill
) -> AsyncGenerator[tuple[int, Any], None]:
    want_logprobs = body.logprobs is not None
    streams = []
    for prompt_text, prompt_ids in plan.prompts:
        state, scores = await prefill(prompt_ids, bool(body.echo and want_logprobs), plan.top)
        for i in range(plan.n):
            generation = stateless.generate(
                state,
                max_tokens=plan.max_tokens,
                sampling=plan.sampling[i],
                stop=plan.stops,
                top_logprobs=plan.top,
            )
            streams.append(_choice(generation, prompt_text, scores, body, plan))
    async for index, item in merge(streams):
        yield index, item


async def _session_completion(
    service: SessionService, tenant: str, body: CompletionRequest, plan: Plan
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
    logprobs = _LogprobsBuilder(plan.tokenizer, plan.top) if body.logprobs is not None else None
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


async def _timed(
    source: AsyncGenerator[tuple[int, Any], None], timing: TokenTiming
) -> AsyncGenerator[tuple[int, Any], None]:
    """The source, observing time to first token and inter-token latency as generated tokens pass."""
    try:
        async for index, item in source:
            if isinstance(item, Piece) and item.generated:
                timing.token(index)
            yield index, item
    finally:
        await source.aclose()


async def _stream(
    first: tuple[int, Any],
    source: AsyncGenerator[tuple[int, Any], None],
    completion_id: str,
    created: int,
    model: str,
    body: CompletionRequest,
) -> AsyncIterator[str]:
    def choices(index: int, event: Piece | Finished) -> list[dict[str, Any]]:
        if isinstance(event, Piece):
            return [{"text": event.text, "index": index, "logprobs": event.logprobs, "finish_reason": None}]
        return [{"text": "", "index": index, "logprobs": None, "finish_reason": event.finish_reason}]

    envelope = {"id": completion_id, "object": "text_completion", "created": created, "model": model}
    usage = body.stream_options is not None and body.stream_options.include_usage
    async for line in stream_choices(first, source, envelope, choices, include_usage=usage):
        yield line


async def stream_choices(
    first: tuple[int, Any],
    source: AsyncGenerator[tuple[int, Any], None],
    envelope: dict[str, Any],
    choices: Callable[[int, Piece | Finished], list[dict[str, Any]]],
    *,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The SSE lines of a streamed OpenAI response (completions and chat): per (choice index, Piece or
    Finished) of `source` (whose first item is `first`), the chunks `choices` makes of it inside `envelope`
    (id, object, created, model); then the usage, if asked for; an error after the first chunk as an error
    event; then `[DONE]`."""
    usage = [0, 0, 0]
    try:
        item: tuple[int, Any] | None = first
        while item is not None:
            index, event = item
            if isinstance(event, Finished):
                usage[0] += event.prompt_tokens
                usage[1] += event.completion_tokens
                usage[2] += event.cached_tokens
            for choice in choices(index, event):
                yield sse.event({**envelope, "choices": [choice]})
            item = await anext(source, None)
        if include_usage:
            counts = {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "total_tokens": usage[0] + usage[1],
                "prompt_tokens_details": {"cached_tokens": usage[2]},
            }
            yield sse.event({**envelope, "choices": [], "usage": counts})
    except ServiceError as exc:
        yield sse.event(stream_error(exc))
    finally:
        await source.aclose()
    yield sse.DONE
