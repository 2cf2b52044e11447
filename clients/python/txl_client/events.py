"""Server-sent events: the lines of a streamed answer become typed events (progress, tokens, a result), and an
error event raises its TxlError.

Work that may take long (append, create with text, import, score, generate) is always asked for as a stream: the
server reports progress (or tokens) while it works, and the timeout, httpx's read timeout, bounds the silence
between two events rather than the whole call.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from .errors import TxlConnectionError, error_from_body
from .retry_rule import transport_error
from .types import GenerateResult, Progress, TokenEvent

M = TypeVar("M", bound=BaseModel)
E = TypeVar("E")

DONE = "[DONE]"


class SSEDecoder:
    """Server-sent events, line by line: returns each event's data once its blank line arrives."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        if not line:
            data, self._data = self._data, []
            return "\n".join(data) if data else None
        if line.startswith(":"):
            return None  # a comment (keep-alive)
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value.removeprefix(" "))
        return None


class EventReader(Generic[E]):
    """The parsed events of one SSE answer up to `[DONE]`: `feed` each line, take the events it completes."""

    def __init__(self, response: httpx.Response, parse: Callable[[dict[str, Any]], E | None]) -> None:
        self.parse = parse
        self.decoder = SSEDecoder()
        self.done = False
        self.timeout = response.request.extensions.get("timeout", {}).get("read")

    def feed(self, line: str) -> list[E]:
        data = self.decoder.feed(line)
        if data is None or self.done:
            return []
        if data == DONE:
            self.done = True
            return []
        event = self.parse(parse_event(data))
        return [] if event is None else [event]

    @contextlib.contextmanager
    def transport_errors(self) -> Iterator[None]:
        """A connection lost while reading raises TxlConnectionError (or TxlTimeoutError)."""
        try:
            yield
        except httpx.TransportError as exc:
            raise transport_error(exc, self.timeout) from exc


def iter_events(response: httpx.Response, parse: Callable[[dict[str, Any]], E | None]) -> Iterator[E]:
    """The parsed events of an SSE response up to `[DONE]`; error events raise their TxlError."""
    reader = EventReader(response, parse)
    with reader.transport_errors():
        for line in response.iter_lines():
            yield from reader.feed(line)
            if reader.done:
                return


async def aiter_events(
    response: httpx.Response, parse: Callable[[dict[str, Any]], E | None]
) -> AsyncGenerator[E, None]:
    """`iter_events` for a response of an `httpx.AsyncClient`."""
    reader = EventReader(response, parse)
    with reader.transport_errors():
        async for line in response.aiter_lines():
            for event in reader.feed(line):
                yield event
            if reader.done:
                return


def parse_event(data: str) -> dict[str, Any]:
    try:
        event = json.loads(data)
    except ValueError as exc:
        raise TxlConnectionError(f"the server sent an unreadable event: {data[:100]!r}") from exc
    if not isinstance(event, dict):
        raise TxlConnectionError(f"the server sent an unexpected event: {data[:100]!r}")
    if event.get("type") == "error":
        raise error_from_body(event)
    return event


def generate_event(event: dict[str, Any]) -> TokenEvent | GenerateResult | Progress | None:
    kind = event.get("type")
    if kind == "token":
        return TokenEvent.model_validate(event["token"])
    if kind == "progress":
        return Progress.model_validate(event)
    if kind == "done":
        return GenerateResult.model_validate({k: v for k, v in event.items() if k != "type"})
    return None  # an event type this client does not know: skip it


def result_events(result: type[M], kind: str = "result") -> Callable[[dict[str, Any]], Progress | M | None]:
    """The parser of a stream of progress events that ends with one `kind` event holding a `result`; other
    events (a generation's tokens, types this client does not know) are skipped."""

    def parse(event: dict[str, Any]) -> Progress | M | None:
        if event.get("type") == "progress":
            return Progress.model_validate(event)
        if event.get("type") == kind:
            return result.model_validate({k: v for k, v in event.items() if k != "type"})
        return None

    return parse


def ended_early(what: str) -> TxlConnectionError:
    return TxlConnectionError(f"the connection closed before the {what} arrived")
