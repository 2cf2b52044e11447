"""`Endpoint`: an operation (operations.py) offered as a method of both clients, written once.

On an object whose `transport` is a `Transport` (the sync `Client`, its `memories`) the method returns the result;
where it is an `AsyncTransport` (`AsyncClient`, its `memories`), an awaitable of it. The method keeps the
operation's signature and docstring (`help(client.append)`), and type checkers see both forms.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Generic, ParamSpec, Protocol, Self, TypeVar, overload

from .operations import Operation
from .transport import AsyncTransport, Transport

P = ParamSpec("P")
T = TypeVar("T")


class OverTransport(Protocol):
    transport: Transport


class OverAsyncTransport(Protocol):
    transport: AsyncTransport


class Endpoint(Generic[P, T]):
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
