"""`AsyncClient`: the asyncio SDK over `httpx.AsyncClient`; the same methods as `Client`, awaited.

async with AsyncClient() as txl:
    session = await txl.create_session(text="Once upon a time")
    async with await txl.generate(session.id, max_tokens=20, stream=True) as stream:
        async for token in stream:
            print(token.text, end="", flush=True)
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar, overload

import httpx

from . import _core
from .errors import TxlConnectionError, TxlError, error_from_response
from .memories import AsyncMemories
from .types import (
    AppendResult,
    GenerateResult,
    Health,
    ModelCard,
    Progress,
    ScoreResult,
    Session,
    SessionVersion,
    TokenEvent,
)

AsyncProgressCallback = Callable[[int, int], object | Awaitable[object]]
T = TypeVar("T")


class AsyncClient:
    """See `Client`: the same options, environment variables, retries and errors."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = _core.DEFAULT_TIMEOUT,
        max_retries: int = _core.DEFAULT_MAX_RETRIES,
        retry_overloaded: bool = False,
        retry_conflicts: bool = False,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._options = _core.Options.resolve(
            url,
            api_key,
            timeout=timeout,
            max_retries=max_retries,
            retry_overloaded=retry_overloaded,
            retry_conflicts=retry_conflicts,
        )
        self._http = http_client or httpx.AsyncClient(timeout=self._options.httpx_timeout())
        self._owns_http = http_client is None

    @property
    def url(self) -> str:
        return self._options.url

    @property
    def retries(self) -> _core.Retries:
        """The requests this client (and those `with_options` made from it) sent again, by reason."""
        return self._options.retries

    @property
    def memories(self) -> AsyncMemories:
        """Preloaded memories: documents read once, that sessions start from (txl_client.memories)."""
        return AsyncMemories(self)

    def with_options(
        self,
        *,
        timeout: float | None = None,
        max_retries: int | None = None,
        retry_overloaded: bool | None = None,
        retry_conflicts: bool | None = None,
    ) -> AsyncClient:
        other = object.__new__(AsyncClient)
        other._options = self._options.with_changes(
            timeout=timeout,
            max_retries=max_retries,
            retry_overloaded=retry_overloaded,
            retry_conflicts=retry_conflicts,
        )
        other._http, other._owns_http = self._http, False
        return other

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------------------------------ sessions

    async def create_session(
        self,
        text: str = "",
        *,
        mem_len: int | None = None,
        ttl_seconds: int | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        on_progress: AsyncProgressCallback | None = None,
        memory: str | None = None,
    ) -> Session:
        """See `Client.create_session`; `on_progress` may be a plain function or a coroutine function."""
        streamed = bool(text) or on_progress is not None
        call = _core.create_session_call(
            text, mem_len, ttl_seconds, metadata, idempotency_key, stream=streamed, memory=memory
        )
        if not streamed:
            return Session.model_validate(await self._json(call))
        return await self._long(call, _core.result_events(Session), on_progress)

    async def get_session(self, session_id: str) -> Session:
        return Session.model_validate(await self._json(_core.session_call("GET", session_id)))

    async def list_sessions(self) -> list[Session]:
        body = await self._json(_core.Call("GET", "/v1/sessions"))
        return [Session.model_validate(s) for s in body["data"]]

    async def delete_session(self, session_id: str, *, idempotency_key: str | None = None) -> None:
        response = await self._send(_core.delete_call(session_id, idempotency_key))
        await response.aclose()

    async def fork_session(
        self,
        session_id: str,
        *,
        metadata: dict[str, Any] | None = None,
        version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Session:
        """See `Client.fork_session`."""
        call = _core.fork_call(session_id, metadata, version, idempotency_key)
        return Session.model_validate(await self._json(call))

    async def versions(self, session_id: str) -> list[SessionVersion]:
        """See `Client.versions`."""
        body = await self._json(_core.versions_call(session_id))
        return [SessionVersion.model_validate(v) for v in body["data"]]

    async def rewind(self, session_id: str, version: int, *, idempotency_key: str | None = None) -> Session:
        """See `Client.rewind`."""
        body = await self._json(_core.rewind_call(session_id, version, idempotency_key))
        return Session.model_validate(body["session"])

    async def append(
        self,
        session_id: str,
        text: str,
        *,
        idempotency_key: str | None = None,
        on_progress: AsyncProgressCallback | None = None,
    ) -> AppendResult:
        """See `Client.append`."""
        call = _core.append_call(session_id, text, idempotency_key)
        return await self._long(call, _core.result_events(AppendResult), on_progress)

    async def export_snapshot(self, session_id: str) -> bytes:
        """See `Client.export_snapshot`."""
        response = await self._send(_core.export_call(session_id))
        return response.content

    async def import_snapshot(
        self, data: bytes, *, ttl_seconds: int | None = None, idempotency_key: str | None = None
    ) -> Session:
        """See `Client.import_snapshot`."""
        call = _core.import_call(data, ttl_seconds, idempotency_key)
        return await self._long(call, _core.result_events(Session), None)

    @overload
    async def generate(
        self,
        session_id: str,
        text: str = "",
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        stream: Literal[False] = False,
        idempotency_key: str | None = None,
        on_progress: AsyncProgressCallback | None = None,
    ) -> GenerateResult: ...

    @overload
    async def generate(
        self,
        session_id: str,
        text: str = "",
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        stream: Literal[True],
        idempotency_key: str | None = None,
        on_progress: AsyncProgressCallback | None = None,
    ) -> AsyncGenerateStream: ...

    async def generate(
        self,
        session_id: str,
        text: str = "",
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        stream: bool = False,
        idempotency_key: str | None = None,
        on_progress: AsyncProgressCallback | None = None,
    ) -> GenerateResult | AsyncGenerateStream:
        """See `Client.generate`; `on_progress` may be a plain function or a coroutine function."""
        body = _core.generate_body(text, max_tokens, temperature, top_k, top_p, stop, seed, True)
        call = _core.step_call(session_id, "generate", body, idempotency_key)
        if not stream:
            return await self._long(call, _core.result_events(GenerateResult, "done"), on_progress)
        return AsyncGenerateStream(self, call, await self._send(call, stream=True), on_progress)

    # ------------------------------------------------------------------------------------------ stateless

    async def score(
        self,
        text: str,
        *,
        token_logprobs: bool = False,
        on_progress: AsyncProgressCallback | None = None,
    ) -> ScoreResult:
        """See `Client.score`; `on_progress` may be a plain function or a coroutine function."""
        call = _core.score_call(text, token_logprobs)
        return await self._long(call, _core.result_events(ScoreResult), on_progress)

    async def models(self) -> list[ModelCard]:
        body = await self._json(_core.Call("GET", "/v1/models"))
        return [ModelCard.model_validate(m) for m in body["data"]]

    async def health(self) -> Health:
        return Health.model_validate(await self._json(_core.Call("GET", "/health")))

    # ------------------------------------------------------------------------------------------ transport

    async def _json(self, call: _core.Call) -> Any:
        response = await self._send(call)
        try:
            return response.json()
        except ValueError as exc:
            raise TxlError(f"the server answered {call.path} with something other than JSON") from exc

    async def _send(
        self, call: _core.Call, *, stream: bool = False, lost: TxlError | None = None
    ) -> httpx.Response:
        return await self._retrying(call, lambda: self._attempt(call, stream=stream), lost=lost)

    async def _long(
        self,
        call: _core.Call,
        parse: Callable[[dict[str, Any]], Progress | T | None],
        on_progress: AsyncProgressCallback | None,
    ) -> T:
        """See `Client._long`."""

        async def attempt() -> T:
            response = await self._attempt(call, stream=True)
            try:
                async with contextlib.aclosing(_events(response, parse)) as events:
                    async for event in events:
                        if not isinstance(event, Progress):
                            return event
                        if on_progress is not None:
                            await _call(on_progress, event.tokens_done, event.tokens_total)
            finally:
                await response.aclose()
            raise _core.ended_early("result")

        return await self._retrying(call, attempt)

    async def _retrying(
        self,
        call: _core.Call,
        attempt: Callable[[], Awaitable[T]],
        *,
        lost: TxlError | None = None,
    ) -> T:
        attempts = 0
        while True:
            error: TxlError
            try:
                return await attempt()
            except TxlError as exc:
                error = exc
            if _core.response_lost(error):
                lost = error
            delay = _core.retry_delay(
                self._options, call, error, attempt=attempts, after_lost_response=lost is not None
            )
            if delay is None:
                raise _core.final_error(error, lost)
            await asyncio.sleep(delay)
            attempts += 1

    async def _attempt(self, call: _core.Call, *, stream: bool) -> httpx.Response:
        request = self._http.build_request(
            call.method,
            self._options.url + call.path,
            json=call.body,
            content=call.content,
            params=call.params,
            headers={**self._options.headers(), **call.request_headers()},
            timeout=self._options.httpx_timeout(),
        )
        try:
            response = await self._http.send(request, stream=stream)
        except httpx.TransportError as exc:
            raise _core.transport_error(exc, self._options.timeout) from exc
        if response.is_success:
            return response
        try:
            content = await response.aread()
        except httpx.TransportError:
            content = b""
        await response.aclose()
        raise error_from_response(response.status_code, content, response.headers)


class AsyncGenerateStream(AsyncIterator[TokenEvent]):
    """See `GenerateStream`: `async for token in stream`, then `stream.result`; `aclose()` stops early."""

    def __init__(
        self,
        client: AsyncClient,
        call: _core.Call,
        response: httpx.Response,
        on_progress: AsyncProgressCallback | None = None,
    ) -> None:
        self._client, self._call, self._response = client, call, response
        self._on_progress = on_progress
        self.idempotency_key = call.idempotency_key
        self.result: GenerateResult | None = None
        self._texts: list[str] = []
        self._events = self._iterate()

    @property
    def text(self) -> str:
        return "".join(self._texts)

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
        retries = 0
        try:
            while True:
                try:
                    async for event in _events(self._response, _core.generate_event):
                        if isinstance(event, TokenEvent):
                            self._texts.append(event.text)
                            yield event
                        elif isinstance(event, Progress):
                            if self._on_progress is not None:
                                await _call(self._on_progress, event.tokens_done, event.tokens_total)
                        else:
                            self.result = event
                    if self.result is None:
                        raise _core.ended_early("generation's result")
                    return
                except TxlConnectionError as error:
                    if self._texts or self.result is not None:
                        raise
                    delay = _core.retry_delay(
                        self._client._options, self._call, error, attempt=retries, after_lost_response=True
                    )
                    if delay is None:
                        raise
                    await self._response.aclose()
                    await asyncio.sleep(delay)
                    retries += 1
                    self._response = await self._client._send(self._call, stream=True, lost=error)
        finally:
            await self._response.aclose()


async def _call(callback: AsyncProgressCallback, done: int, total: int) -> None:
    outcome = callback(done, total)
    if inspect.isawaitable(outcome):
        await outcome


async def _events(
    response: httpx.Response, parse: Callable[[dict[str, Any]], Any]
) -> AsyncGenerator[Any, None]:
    decoder = _core.SSEDecoder()
    timeout = response.request.extensions.get("timeout", {}).get("read")
    try:
        async for line in response.aiter_lines():
            data = decoder.feed(line)
            if data is None:
                continue
            if data == _core.DONE:
                return
            event = parse(_core.parse_event(data))
            if event is not None:
                yield event
    except httpx.TransportError as exc:
        raise _core.transport_error(exc, timeout) from exc
