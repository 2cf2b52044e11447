"""Work that belongs to no session: scoring a document, and completions of a prompt (OpenAI style).

Both start from an empty memory primed with the separator token, exactly as a new session does, so a prompt
completes the same whether it is sent here or used to create a session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from txl import TransfoXLLMHeadModel, scoring
from txl.sampling import SamplingParams
from txl.tokenizers import Tokenizer

from ..admission.classes import RequestClass
from ..engine.jobs import (
    GenerateJob,
    GenerateResult,
    TokenEvent,
    run_job,
)
from ..engine.state import ModelState
from ..engine.worker import Worker
from ..errors import InvalidRequest
from .observer import SessionObserver
from .prefix_cache import PromptReader


def cached_tokens(positions: int) -> int:
    """Prompt tokens served from the cache: its positions but the start token (which is not the user's)."""
    return max(0, positions - 1)


@dataclass(frozen=True)
class ScoreOutcome:
    tokens: int
    bytes: int
    logprob: float
    token_logprobs: list[float] | None
    token_ids: list[int]
    memory_bytes: int  # what the scoring memory held at the end: bounded by mem_len, whatever the length
    cached_tokens: int = 0  # of the text's tokens, read from the prefix cache

    @property
    def nll(self) -> float:
        return scoring.nll(self.logprob, self.tokens)

    @property
    def perplexity(self) -> float:
        return scoring.perplexity(self.logprob, self.tokens)

    @property
    def bits_per_byte(self) -> float:
        return scoring.bits_per(self.logprob, self.bytes)


@dataclass(frozen=True)
class PromptScores:
    """Per-token log-probs of a prompt (the first token is predicted by the start of the document)."""

    token_ids: list[int]
    logprobs: list[float]
    top: list | None
    cached_tokens: int = 0  # of the prompt's tokens, read from the prefix cache


class StatelessService:
    def __init__(
        self,
        *,
        model: TransfoXLLMHeadModel,
        tokenizer: Tokenizer,
        worker: Worker,
        prompts: PromptReader,
        mem_len: int,
        observer: SessionObserver | None = None,
    ) -> None:
        self.model, self.tokenizer, self.worker = model, tokenizer, worker
        self.prompts, self.mem_len = prompts, mem_len
        self.observer = observer or SessionObserver()

    async def score(
        self,
        text: str,
        *,
        owner: str,
        token_logprobs: bool = False,
        progress: Callable[[int, int], None] | None = None,
        klass: RequestClass | None = None,
    ) -> ScoreOutcome:
        """log p(text), segment by segment, with memory bounded by mem_len whatever the length; a prefix the owner
        had read recently comes from the prefix cache, with the same numbers."""
        tokens = self.tokenizer.encode(text)
        if not tokens:
            raise InvalidRequest("text to score is empty", param="text")

        if progress is not None:
            progress(0, len(tokens))
        result = await self.prompts.read(
            owner, tokens, mem_len=self.mem_len, scores=True, progress=progress, klass=klass
        )
        result.state.release()  # nothing is kept
        self.observer.on_tokens("scored", len(tokens))
        self.observer.on_prefix_cache(result.cached, len(tokens) + 1)
        assert result.token_logprobs is not None
        return ScoreOutcome(
            len(tokens),
            len(text.encode("utf-8", "surrogatepass")),
            result.logprob,
            result.token_logprobs[1:] if token_logprobs else None,
            tokens,
            result.state.nbytes,
            cached_tokens(result.cached),
        )

    async def prefill(
        self,
        tokens: list[int],
        *,
        owner: str,
        logprobs: bool,
        top_logprobs: int,
        klass: RequestClass | None = None,
    ) -> tuple[ModelState, PromptScores]:
        """Feeds a prompt after the start token (from the prefix cache where the owner read its beginning
        recently); with `logprobs`, scores every prompt token. The state is the caller's: it releases it when its
        generations have started from it."""
        result = await self.prompts.read(
            owner, tokens, mem_len=self.mem_len, scores=logprobs, top_logprobs=top_logprobs, klass=klass
        )
        self.observer.on_tokens("ingested", len(tokens))
        self.observer.on_prefix_cache(result.cached, len(tokens) + 1)
        scores = PromptScores(
            tokens,
            (result.token_logprobs or [])[1:],
            result.token_top[1:] if result.token_top is not None else None,
            cached_tokens(result.cached),
        )
        return result.state, scores

    async def generate(
        self,
        state: ModelState,
        *,
        max_tokens: int,
        sampling: SamplingParams,
        stop: list[str],
        top_logprobs: int = 0,
        klass: RequestClass | None = None,
    ) -> AsyncGenerator[TokenEvent | GenerateResult, None]:
        """Tokens after `state` (nothing is stored): TokenEvents, then the GenerateResult."""
        job = GenerateJob(state, [], max_tokens, sampling, stop, top_logprobs=top_logprobs, klass=klass)
        async with contextlib.aclosing(run_job(self.worker, job)) as events:
            async for event in events:
                if isinstance(event, GenerateResult):
                    self.observer.on_tokens("generated", event.completion_tokens)
                    event.state.release()  # nothing is stored
                yield event


def merge(streams: list[AsyncGenerator]) -> AsyncGenerator[tuple[int, object], None]:
    """Interleaves several async generators as (index, item), in arrival order; closes all at the end."""

    async def run() -> AsyncGenerator[tuple[int, object], None]:
        queue: asyncio.Queue[tuple[int, object, bool]] = asyncio.Queue()

        async def pump(i: int, stream: AsyncGenerator) -> None:
            try:
                async for item in stream:
                    await queue.put((i, item, False))
                await queue.put((i, None, True))
            except BaseException as exc:
                await queue.put((i, exc, True))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        remaining = len(streams)
        try:
            while remaining:
                i, item, finished = await queue.get()
                if finished:
                    remaining -= 1
                    if isinstance(item, BaseException):
                        raise item
                    continue
                yield i, item
        finally:
            for task in tasks:
                task.cancel()
            for stream in streams:
                with contextlib.suppress(BaseException):
                    await stream.aclose()

    return run()
