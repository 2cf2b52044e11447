"""A runtime (worker, Redis store, session service) started for the length of a block, and a client of its
service that goes away."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from txl.sampling import SamplingParams
from txl_server.runtime import Runtime
from txl_server.sessions.service import GenerateOutcome
from txl_server.settings import Settings

OWNER = "tenant-a"


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Runtime]:
    runtime = Runtime(settings)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


async def leave_after(stream: AsyncGenerator[Any, None], events: int) -> None:
    """Reads `events` events of a generation, then closes it, as a client that goes away mid-stream."""
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == events:
            break
    await stream.aclose()


async def generate(
    service: Any, session_id: str, *, owner: str = OWNER, **kwargs: Any
) -> tuple[list[Any], Any]:
    """A generation on the session service, read to its end: (its token events, its outcome). Greedy, 12 tokens,
    unless told otherwise."""
    kwargs.setdefault("max_tokens", 12)
    kwargs.setdefault("sampling", SamplingParams(temperature=0))
    tokens, outcome = [], None
    async for event in service.generate(owner, session_id, **kwargs):
        if isinstance(event, GenerateOutcome):
            outcome = event
        else:
            tokens.append(event)
    return tokens, outcome
