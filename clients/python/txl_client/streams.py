"""A streamed generation's tokens as they arrive: `GenerateStream` (sync) and `AsyncGenerateStream` (async).

A transport failure before the first token reconnects (the transport's `reconnect`: the same Idempotency-Key,
after the retry rule's wait); after it, it raises TxlConnectionError: `generate(...,
idempotency_key=stream.idempotency_key)` then returns the committed result if the generation finished, or runs
it again if it did not.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator

import httpx

from .calls import Call
from .errors import TxlConnectionError
from .events import aiter_events, ended_early, generate_event, iter_events
from .operations import ProgressCallback
from .types import GenerateResult, Progress, TokenEvent


async def report_progress(on_progress: ProgressCallback | None, progress: Progress) -> None:
    """Calls `on_progress(tokens_done, tokens_total)`, a plain function or a coroutine function, if given."""
    if on_progress is not None:
        outcome = on_progress(progress.tokens_done, progress.tokens_total)
        if inspect.isawaitable(outcome):
            await outcome


class StreamedGeneration:
    """What both streams keep: the text so far, the final result once it came, the key to resume with."""

    def __init__(self, call: Call, response: httpx.Response, on_progress: ProgressCallback | None) -> None:
        self.idempotency_key = call.idempotency_key
        self.result: GenerateResult | None = None
        self._response = response
        self._on_progress = on_progress
        self._texts: list[str] = []

    @property
    def text(self) -> str:
        """The text generated so far."""
        return "".join(self._texts)

    def _keep(self, event: TokenEvent | GenerateResult) -> TokenEvent | None:
        """A token is added to the text (and returned, to be yielded); the result is kept."""
        if isinstance(event, TokenEvent):
            self._texts.append(event.text)
            return event
        self.result = event
        return None

    def _check_complete(self) -> None:
        if self.result is None:
            raise ended_early("generation's result")

    def _reconnectable(self, error: TxlConnectionError) -> TxlConnectionError:
        """`error`, if the stream may reconnect after it: only before the first token (a new attempt would not
        continue what was yielded); else raises it."""
        if self._texts or self.result is not None:
            raise error
        return error


class GenerateStream(StreamedGeneration, Iterator[TokenEvent]):
    """The tokens of a streamed generation, as they arrive; then `result` is the final GenerateResult.

    Use it in a `with` block, or `close()` it, to stop early: the server cancels the generation and commits
    nothing. A transport failure before the first token is retried (same Idempotency-Key); after it, it raises
    TxlConnectionError (see the module's docstring).
    """

    def __init__(
        self,
        call: Call,
        response: httpx.Response,
        on_progress: ProgressCallback | None,
        reconnect: Callable[[TxlConnectionError], httpx.Response],
    ) -> None:
        super().__init__(call, response, on_progress)
        self._reconnect = reconnect
        self._events = self._iterate()

    def __next__(self) -> TokenEvent:
        return next(self._events)

    def finish(self) -> GenerateResult:
        """Reads the rest of the stream and returns the final result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        self._events.close()
        self._response.close()

    def __enter__(self) -> GenerateStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _iterate(self) -> Generator[TokenEvent, None, None]:
        try:
            while True:
                try:
                    yield from self._tokens()
                    return
                except TxlConnectionError as error:
                    self._response.close()
                    self._response = self._reconnect(self._reconnectable(error))
        finally:
            self._response.close()

    def _tokens(self) -> Iterator[TokenEvent]:
        events: Iterator[TokenEvent | GenerateResult | Progress] = iter_events(self._response, generate_event)
        for event in events:
            if isinstance(event, Progress):
                if self._on_progress is not None:
                    self._on_progress(event.tokens_done, event.tokens_total)
            elif (token := self._keep(event)) is not None:
                yield token
        self._check_complete()


class AsyncGenerateStream(StreamedGeneration, AsyncIterator[TokenEvent]):
    """See `GenerateStream`: `async for token in stream`, then `stream.result`; `aclose()` stops early."""

    def __init__(
        self,
        call: Call,
        response: httpx.Response,
        on_progress: ProgressCallback | None,
        reconnect: Callable[[TxlConnectionError], Awaitable[httpx.Response]],
    ) -> None:
        super().__init__(call, response, on_progress)
        self._reconnect = reconnect
        self._events = self._iterate()

    async def __anext__(self) -> TokenEvent:
        return await anext(self._events)

    async def finish(self) -> GenerateResult:
        async for _ in self:
            pass
        assert self.result is not None
        return self.result

    async def aclose(self) -> None:
        await self._events.aclose()
        await self._response.aclose()

    async def __aenter__(self) -> AsyncGenerateStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _iterate(self) -> AsyncGenerator[TokenEvent, None]:
        try:
            while True:
                try:
                    events: AsyncIterator[TokenEvent | GenerateResult | Progress]
                    events = aiter_events(self._response, generate_event)
                    async for event in events:
                        if isinstance(event, Progress):
                            await report_progress(self._on_progress, event)
                        elif (token := self._keep(event)) is not None:
                            yield token
                    self._check_complete()
                    return
                except TxlConnectionError as error:
                    await self._response.aclose()
                    self._response = await self._reconnect(self._reconnectable(error))
        finally:
            await self._response.aclose()
