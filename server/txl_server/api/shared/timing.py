"""Time to first token and inter-token latency, observed as a request's tokens pass."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from typing import TypeVar

from ...metrics import Metrics

Item = TypeVar("Item")


class TokenTiming:
    """Time to first token and inter-token latency of one request (of each of its choices, for several)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics, self.started = metrics, time.perf_counter()
        self.first_seen = False
        self.last: dict[int, float] = {}

    def token(self, choice: int = 0) -> None:
        now = time.perf_counter()
        if not self.first_seen:
            self.first_seen = True
            self.metrics.time_to_first_token.observe(now - self.started)
        if choice in self.last:
            self.metrics.inter_token.observe(now - self.last[choice])
        self.last[choice] = now


async def timed(
    source: AsyncGenerator[Item, None], timing: TokenTiming, token_choice: Callable[[Item], int | None]
) -> AsyncGenerator[Item, None]:
    """The source's items, observing a token of choice `token_choice(item)` as each generated token passes
    (None: the item is not one)."""
    try:
        async for item in source:
            choice = token_choice(item)
            if choice is not None:
                timing.token(choice)
            yield item
    finally:
        await source.aclose()
