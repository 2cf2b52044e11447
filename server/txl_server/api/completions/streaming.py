"""A streamed OpenAI response (completions and chat): its chunks as SSE lines, each inside the response's
envelope (id, object, created, model), then the usage if asked for, and `[DONE]`."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ..shared import sse
from ..shared.event_stream import EventStream
from ..shared.openai_errors import openai_ending
from .generation import Finished, Piece

# The chunks one (choice index, Piece or Finished) becomes.
Chunks = Callable[[int, Piece | Finished], list[dict[str, Any]]]


@dataclass(frozen=True)
class Envelope:
    """What names one response, streamed or not: its id, when it was made, by which model, in which service
    tier."""

    id: str
    created: int
    model: str
    service_tier: str = "default"

    @classmethod
    def new(cls, prefix: str, model: str, service_tier: str = "default") -> Envelope:
        return cls(prefix + secrets.token_hex(12), int(time.time()), model, service_tier)

    def chunk(self, kind: str) -> dict[str, Any]:
        """The fields every chunk of a streamed response repeats (`kind`: its `object`)."""
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "service_tier": self.service_tier,
        }


async def event_stream(
    source: AsyncGenerator[tuple[int, Any], None],
    envelope: dict[str, Any],
    chunks: Chunks,
    *,
    include_usage: bool,
) -> EventStream:
    """The streamed response of `source`, once its first item came (an error before any output is an HTTP
    error, not a stream)."""
    first = await anext(source)
    return EventStream(
        stream_choices(first, source, envelope, chunks, include_usage=include_usage), ending=openai_ending
    )


async def stream_choices(
    first: tuple[int, Any],
    source: AsyncGenerator[tuple[int, Any], None],
    envelope: dict[str, Any],
    chunks: Chunks,
    *,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The SSE lines of a streamed OpenAI response: per (choice index, Piece or Finished) of `source` (whose
    first item is `first`), the chunks `chunks` makes of it inside `envelope`; then the usage, if asked for; then
    `[DONE]`. (An error after the first chunk ends the stream with OpenAI's error event, then `[DONE]`: the
    EventStream's `openai_ending`.)"""
    usage = [0, 0, 0]
    try:
        item: tuple[int, Any] | None = first
        while item is not None:
            index, event = item
            if isinstance(event, Finished):
                usage[0] += event.prompt_tokens
                usage[1] += event.completion_tokens
                usage[2] += event.cached_tokens
            for choice in chunks(index, event):
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
    finally:
        await source.aclose()
    yield sse.DONE
