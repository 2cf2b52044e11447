"""How the clients send: `Transport` over `httpx.Client`, `AsyncTransport` over `httpx.AsyncClient`.

Each runs an operation (operations.py): sends its call, tries again as the retry rule allows (retry_rule.py), and
reads the answer whole or as a stream of events. A client and the clients `with_options` makes from it share one
transport's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, replace
from typing import Any, Generic, ParamSpec, Self, TypeVar

import httpx

from .calls import Call
from .errors import TxlConnectionError, TxlError, error_from_response
from .events import aiter_events, ended_early, iter_events
from .operations import Operation
from .options import Options
from .retry_rule import Retrying, transport_error
from .streams import AsyncGenerateStream, GenerateStream, report_progress
from .types import GenerateResult, Progress

P = ParamSpec("P")
T = TypeVar("T")
H = TypeVar("H", httpx.Client, httpx.AsyncClient)


@dataclass
class Connection(Generic[H]):
    """An httpx client and the options its requests are sent with."""

    options: Options
    http: H
    owns_http: bool  # False for a client's copy made by with_options: closing it leaves the connections open

    def with_options(self, **changes: Any) -> Self:
        return replace(self, options=self.options.with_changes(**changes), owns_http=False)

    def request(self, call: Call) -> httpx.Request:
        return self.http.build_request(
            call.method,
            self.options.url + call.path,
            json=call.body,
            content=call.content,
            params=call.params,
            headers={**self.options.headers(), **call.request_headers()},
            timeout=self.options.httpx_timeout(),
        )

    def retrying(self, call: Call, lost: TxlError | None = None) -> Retrying:
        return Retrying(self.options, call, lost=lost)


class Transport(Connection[httpx.Client]):
    @classmethod
    def open(cls, options: Options, http: httpx.Client | None) -> Transport:
        return cls(options, http or httpx.Client(timeout=options.httpx_timeout()), http is None)

    def close(self) -> None:
        if self.owns_http:
            self.http.close()

    def method(self, build: Callable[P, Operation[T]]) -> Callable[P, T]:
        """The client method that runs the operations `build` makes and returns their results."""

        @functools.wraps(build)
        def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return self.run(build(*args, **kwargs))

        return method

    def run(self, operation: Operation[T]) -> T:
        if operation.events is not None:
            return self._run_streamed(operation, operation.events)
        assert operation.answer is not None
        response = self.send(operation.call)
        try:
            return operation.answer(response)
        finally:
            response.close()

    def stream(self, operation: Operation[GenerateResult]) -> GenerateStream:
        """A generation's tokens as they come; a stream broken before its first token reconnects."""
        call = operation.call
        retrying = self.retrying(call)

        def reconnect(error: TxlConnectionError) -> httpx.Response:
            time.sleep(retrying.wait_after(error))
            return self.send(call, stream=True, lost=error)

        return GenerateStream(call, self.send(call, stream=True), operation.on_progress, reconnect)

    def send(self, call: Call, *, stream: bool = False, lost: TxlError | None = None) -> httpx.Response:
        """The successful response to `call`, after any retries the options allow; else a TxlError."""
        return self._retrying(self.retrying(call, lost), lambda: self._attempt(call, stream=stream))

    def _run_streamed(
        self, operation: Operation[T], parse: Callable[[dict[str, Any]], Progress | T | None]
    ) -> T:
        """The result of a streamed answer: its progress goes to `on_progress`. A stream that breaks is retried
        like a lost response (the same Idempotency-Key: the server replays, or runs the work anew)."""

        def attempt() -> T:
            response = self._attempt(operation.call, stream=True)
            events: Iterator[Progress | T] = iter_events(response, parse)
            try:
                for event in events:
                    if not isinstance(event, Progress):
                        return event
                    if operation.on_progress is not None:
                        operation.on_progress(event.tokens_done, event.tokens_total)
            finally:
                response.close()
            raise ended_early("result")

        return self._retrying(self.retrying(operation.call), attempt)

    def _retrying(self, retrying: Retrying, attempt: Callable[[], T]) -> T:
        """`attempt()`, again after each TxlError the options allow retrying."""
        while True:
            try:
                return attempt()
            except TxlError as error:
                failed = error
            time.sleep(retrying.wait_after(failed))

    def _attempt(self, call: Call, *, stream: bool) -> httpx.Response:
        """One try: the successful response, or a TxlError."""
        try:
            response = self.http.send(self.request(call), stream=stream)
        except httpx.TransportError as exc:
            raise transport_error(exc, self.options.timeout) from exc
        if response.is_success:
            return response
        try:
            content = response.read()
        except httpx.TransportError:
            content = b""
        response.close()
        raise error_from_response(response.status_code, content, response.headers)


class AsyncTransport(Connection[httpx.AsyncClient]):
    """`Transport` for asyncio: the same rules, awaited."""

    @classmethod
    def open(cls, options: Options, http: httpx.AsyncClient | None) -> AsyncTransport:
        return cls(options, http or httpx.AsyncClient(timeout=options.httpx_timeout()), http is None)

    async def aclose(self) -> None:
        if self.owns_http:
            await self.http.aclose()

    def method(self, build: Callable[P, Operation[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        """The client method that runs the operations `build` makes and returns awaitables of their results."""

        @functools.wraps(build)
        async def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return await self.run(build(*args, **kwargs))

        return method

    async def run(self, operation: Operation[T]) -> T:
        if operation.events is not None:
            return await self._run_streamed(operation, operation.events)
        assert operation.answer is not None
        response = await self.send(operation.call)
        try:
            return operation.answer(response)
        finally:
            await response.aclose()

    async def stream(self, operation: Operation[GenerateResult]) -> AsyncGenerateStream:
        call = operation.call
        retrying = self.retrying(call)

        async def reconnect(error: TxlConnectionError) -> httpx.Response:
            await asyncio.sleep(retrying.wait_after(error))
            return await self.send(call, stream=True, lost=error)

        return AsyncGenerateStream(call, await self.send(call, stream=True), operation.on_progress, reconnect)

    async def send(self, call: Call, *, stream: bool = False, lost: TxlError | None = None) -> httpx.Response:
        return await self._retrying(self.retrying(call, lost), lambda: self._attempt(call, stream=stream))

    async def _run_streamed(
        self, operation: Operation[T], parse: Callable[[dict[str, Any]], Progress | T | None]
    ) -> T:
        async def attempt() -> T:
            response = await self._attempt(operation.call, stream=True)
            events: AsyncGenerator[Progress | T, None] = aiter_events(response, parse)
            try:
                async with contextlib.aclosing(events):
                    async for event in events:
                        if not isinstance(event, Progress):
                            return event
                        await report_progress(operation.on_progress, event)
            finally:
                await response.aclose()
            raise ended_early("result")

        return await self._retrying(self.retrying(operation.call), attempt)

    async def _retrying(self, retrying: Retrying, attempt: Callable[[], Awaitable[T]]) -> T:
        while True:
            try:
                return await attempt()
            except TxlError as error:
                failed = error
            await asyncio.sleep(retrying.wait_after(failed))

    async def _attempt(self, call: Call, *, stream: bool) -> httpx.Response:
        try:
            response = await self.http.send(self.request(call), stream=stream)
        except httpx.TransportError as exc:
            raise transport_error(exc, self.options.timeout) from exc
        if response.is_success:
            return response
        try:
            content = await response.aread()
        except httpx.TransportError:
            content = b""
        await response.aclose()
        raise error_from_response(response.status_code, content, response.headers)
