"""`Endpoint`: an operation (operations.py) offered as a method of both clients, written once.

On an object whose `transport` is a `Transport` (the sync `Client`, its `memories`) the method returns the result;
where it is an `AsyncTransport` (`AsyncClient`, its `memories`), an awaitable of it. The method keeps the
operation's signature and docstring (`help(client.append)`), and type checkers see both forms.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Literal, ParamSpec, Protocol, Self, TypeVar, Unpack, overload

from . import operations
from .operations import GenerateOptions, Operation
from .streams import AsyncGenerateStream, GenerateStream
from .transport import AsyncTransport, Transport
from .types import GenerateResult

P = ParamSpec("P")
T = TypeVar("T")
ResultT = TypeVar("ResultT", covariant=True)
StreamT = TypeVar("StreamT", covariant=True)


class OverTransport(Protocol):
    transport: Transport


class OverAsyncTransport(Protocol):
    transport: AsyncTransport


class Endpoint(Generic[P, T]):
    """The method of both clients that runs the operations `build` makes."""

    def __init__(self, build: Callable[P, Operation[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, api: None, owner: type) -> Self: ...
    @overload
    def __get__(self, api: OverTransport, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, api: OverAsyncTransport, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, api: OverTransport | OverAsyncTransport | None, owner: type) -> Any:
        if api is None:
            return self
        return api.transport.method(self.build)


class Generate(Protocol[ResultT, StreamT]):
    """`generate`'s two forms: its result, or with `stream=True` the stream of its tokens."""

    @overload
    def __call__(
        self,
        session_id: str,
        text: str = "",
        *,
        stream: Literal[False] = False,
        **options: Unpack[GenerateOptions],
    ) -> ResultT: ...
    @overload
    def __call__(
        self, session_id: str, text: str = "", *, stream: Literal[True], **options: Unpack[GenerateOptions]
    ) -> StreamT: ...


class GenerateEndpoint:
    """`generate` on both clients: `Endpoint`'s rule, with the stream of tokens (`GenerateStream`,
    `AsyncGenerateStream`) as a second form."""

    def __init__(self) -> None:
        self.__doc__ = operations.generate.__doc__

    @overload
    def __get__(self, api: None, owner: type) -> Self: ...
    @overload
    def __get__(self, api: OverTransport, owner: type) -> Generate[GenerateResult, GenerateStream]: ...
    @overload
    def __get__(
        self, api: OverAsyncTransport, owner: type
    ) -> Generate[Coroutine[Any, Any, GenerateResult], Coroutine[Any, Any, AsyncGenerateStream]]: ...
    def __get__(self, api: OverTransport | OverAsyncTransport | None, owner: type) -> Any:
        if api is None:
            return self
        transport = api.transport

        @functools.wraps(operations.generate)
        def generate(session_id: str, text: str = "", *, stream: bool = False, **options: Any) -> Any:
            operation = operations.generate(session_id, text, **options)
            return transport.stream(operation) if stream else transport.run(operation)

        return generate
