"""`Client`: the synchronous SDK over `httpx.Client`.

from txl_client import Client
with Client("http://127.0.0.1:8000") as txl:
    session = txl.create_session(text="It was a dark and stormy night")
    print(txl.generate(session.id, max_tokens=20, temperature=0).text)
    with txl.generate(session.id, max_tokens=20, stream=True) as stream:
        for token in stream:
            print(token.text, end="", flush=True)
    print(stream.result.session.version)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, Literal, TypeVar, overload

import httpx

from . import _core
from .errors import TxlConnectionError, TxlError, error_from_response
from .memories import Memories
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

ProgressCallback = Callable[[int, int], object]
T = TypeVar("T")


class Client:
    """A TXL Serve client. `url` defaults to $TXL_URL (else http://127.0.0.1:8000), `api_key` to $TXL_API_KEY.

    `timeout` is how long the client waits for the server to answer or to report progress: work that may take
    long (append, create with text, import, score, generate) is streamed, so a 1 MiB append takes as long as it
    takes, while a server that says nothing for `timeout` seconds raises TxlTimeoutError.

    Steps that change a session (create, append, generate, fork, import, delete) carry an Idempotency-Key, fresh
    per call and the same on its retries: transport failures are retried (up to `max_retries`) without ever
    stepping twice, and so are a proxy's 502, 503 and 504 (a replica that failed or is restarting). 429
    Overloaded is retried, honouring Retry-After, only with `retry_overloaded=True`; 409 Conflict (another step
    on the same session is running) only with `retry_conflicts=True` (or `with_options`). `retries` counts what
    was sent again, and each retry is logged (logger "txl_client"). Every request that works on a session carries
    its id in an `X-TXL-Session` header too (from the path, `session_id` or `previous_response_id`), for proxies
    that route by session.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = _core.DEFAULT_TIMEOUT,
        max_retries: int = _core.DEFAULT_MAX_RETRIES,
        retry_overloaded: bool = False,
        retry_conflicts: bool = False,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._options = _core.Options.resolve(
            url,
            api_key,
            timeout=timeout,
            max_retries=max_retries,
            retry_overloaded=retry_overloaded,
            retry_conflicts=retry_conflicts,
        )
        self._http = http_client or httpx.Client(timeout=self._options.httpx_timeout())
        self._owns_http = http_client is None

    @property
    def url(self) -> str:
        return self._options.url

    @property
    def retries(self) -> _core.Retries:
        """The requests this client (and those `with_options` made from it) sent again, by reason."""
        return self._options.retries

    @property
    def memories(self) -> Memories:
        """Preloaded memories: documents read once, that sessions start from (txl_client.memories)."""
        return Memories(self)

    def with_options(
        self,
        *,
        timeout: float | None = None,
        max_retries: int | None = None,
        retry_overloaded: bool | None = None,
        retry_conflicts: bool | None = None,
    ) -> Client:
        """A client sharing this one's connections, with some options changed (for one call or a few)."""
        other = object.__new__(Client)
        other._options = self._options.with_changes(
            timeout=timeout,
            max_retries=max_retries,
            retry_overloaded=retry_overloaded,
            retry_conflicts=retry_conflicts,
        )
        other._http, other._owns_http = self._http, False
        return other

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ sessions

    def create_session(
        self,
        text: str = "",
        *,
        mem_len: int | None = None,
        ttl_seconds: int | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        on_progress: ProgressCallback | None = None,
        memory: str | None = None,
    ) -> Session:
        """A new session primed with `text`; `on_progress(tokens_done, tokens_total)` is called as the server
        feeds it (a long text is streamed, so it never times out while progress arrives). With `memory` (an id
        from `memories.create`), after that memory's document (its state shared: as fast for a long document as
        for a short one)."""
        streamed = bool(text) or on_progress is not None
        call = _core.create_session_call(
            text, mem_len, ttl_seconds, metadata, idempotency_key, stream=streamed, memory=memory
        )
        if not streamed:
            return Session.model_validate(self._json(call))
        return self._long(call, _core.result_events(Session), on_progress)

    def get_session(self, session_id: str) -> Session:
        return Session.model_validate(self._json(_core.session_call("GET", session_id)))

    def list_sessions(self) -> list[Session]:
        body = self._json(_core.Call("GET", "/v1/sessions"))
        return [Session.model_validate(s) for s in body["data"]]

    def delete_session(self, session_id: str, *, idempotency_key: str | None = None) -> None:
        self._send(_core.delete_call(session_id, idempotency_key)).close()

    def fork_session(
        self,
        session_id: str,
        *,
        metadata: dict[str, Any] | None = None,
        version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Session:
        """A new session continuing from this one's newest version, or from a kept `version` (see `versions`):
        the two share their memory until they differ."""
        call = _core.fork_call(session_id, metadata, version, idempotency_key)
        return Session.model_validate(self._json(call))

    def versions(self, session_id: str) -> list[SessionVersion]:
        """The versions the session keeps (the server's TXL_KEEP_VERSIONS, 32 by default), newest first: each a
        committed step (create, append, generate, import, rewind) you can `rewind` to or fork from."""
        body = self._json(_core.versions_call(session_id))
        return [SessionVersion.model_validate(v) for v in body["data"]]

    def rewind(self, session_id: str, version: int, *, idempotency_key: str | None = None) -> Session:
        """The session continues from a kept `version`'s memory, exactly as if it had read only that version's
        text. The rewind is itself a step, a new version: nothing is lost, and another rewind undoes it. A
        version no longer kept raises VersionNotFound (its message names the oldest kept one)."""
        body = self._json(_core.rewind_call(session_id, version, idempotency_key))
        return Session.model_validate(body["session"])

    def append(
        self,
        session_id: str,
        text: str,
        *,
        idempotency_key: str | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> AppendResult:
        """Adds `text` to the session; `on_progress(tokens_done, tokens_total)` is called as the server feeds it."""
        call = _core.append_call(session_id, text, idempotency_key)
        return self._long(call, _core.result_events(AppendResult), on_progress)

    def export_snapshot(self, session_id: str) -> bytes:
        """The session's memory and metadata as one safetensors file, for `import_snapshot` (here or elsewhere)."""
        response = self._send(_core.export_call(session_id))
        return response.content

    def import_snapshot(
        self, data: bytes, *, ttl_seconds: int | None = None, idempotency_key: str | None = None
    ) -> Session:
        """A new session (new id, yours) holding an exported session's memory."""
        call = _core.import_call(data, ttl_seconds, idempotency_key)
        return self._long(call, _core.result_events(Session), None)

    @overload
    def generate(
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
        on_progress: ProgressCallback | None = None,
    ) -> GenerateResult: ...

    @overload
    def generate(
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
        on_progress: ProgressCallback | None = None,
    ) -> GenerateStream: ...

    def generate(
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
        on_progress: ProgressCallback | None = None,
    ) -> GenerateResult | GenerateStream:
        """Adds `text` (may be empty), then generates. Unset sampling values take the server's defaults
        (256 tokens, temperature 1, top-p 1). With `stream=True`, returns a GenerateStream of TokenEvents whose
        `result` is the final GenerateResult; errors before the first event are raised here.

        A long `text` takes the server a while before the first token: `on_progress(tokens_done, tokens_total)`
        is called as it is fed. The call always streams (without `stream=True` it still returns the
        GenerateResult): while progress and tokens arrive, the client's timeout does not run out."""
        body = _core.generate_body(text, max_tokens, temperature, top_k, top_p, stop, seed, True)
        call = _core.step_call(session_id, "generate", body, idempotency_key)
        if not stream:
            return self._long(call, _core.result_events(GenerateResult, "done"), on_progress)
        return GenerateStream(self, call, self._send(call, stream=True), on_progress)

    # ------------------------------------------------------------------------------------------ stateless

    def score(
        self, text: str, *, token_logprobs: bool = False, on_progress: ProgressCallback | None = None
    ) -> ScoreResult:
        """Log-likelihood of a document. `on_progress(tokens_done, tokens_total)` is called as the server
        reports progress (a few times a second on long documents)."""
        call = _core.score_call(text, token_logprobs)
        return self._long(call, _core.result_events(ScoreResult), on_progress)

    def models(self) -> list[ModelCard]:
        return [ModelCard.model_validate(m) for m in self._json(_core.Call("GET", "/v1/models"))["data"]]

    def health(self) -> Health:
        return Health.model_validate(self._json(_core.Call("GET", "/health")))

    # ------------------------------------------------------------------------------------------ transport

    def _json(self, call: _core.Call) -> Any:
        response = self._send(call)
        try:
            return response.json()
        except ValueError as exc:
            raise TxlError(f"the server answered {call.path} with something other than JSON") from exc

    def _send(
        self, call: _core.Call, *, stream: bool = False, lost: TxlError | None = None
    ) -> httpx.Response:
        """The successful response to `call`, after any retries the options allow; else a TxlError."""
        return self._retrying(call, lambda: self._attempt(call, stream=stream), lost=lost)

    def _long(
        self,
        call: _core.Call,
        parse: Callable[[dict[str, Any]], Progress | T | None],
        on_progress: ProgressCallback | None,
    ) -> T:
        """The result of a streamed call: its progress goes to `on_progress`. A stream that breaks is retried
        like a lost response (the same Idempotency-Key: the server replays, or runs the work anew)."""

        def attempt() -> T:
            response = self._attempt(call, stream=True)
            try:
                for event in _events(response, parse):
                    if not isinstance(event, Progress):
                        return event
                    if on_progress is not None:
                        on_progress(event.tokens_done, event.tokens_total)
            finally:
                response.close()
            raise _core.ended_early("result")

        return self._retrying(call, attempt)

    def _retrying(self, call: _core.Call, attempt: Callable[[], T], *, lost: TxlError | None = None) -> T:
        """`attempt()`, again after each TxlError the options allow retrying."""
        attempts = 0
        while True:
            error: TxlError
            try:
                return attempt()
            except TxlError as exc:
                error = exc
            if _core.response_lost(error):
                lost = error
            delay = _core.retry_delay(
                self._options, call, error, attempt=attempts, after_lost_response=lost is not None
            )
            if delay is None:
                raise _core.final_error(error, lost)
            time.sleep(delay)
            attempts += 1

    def _attempt(self, call: _core.Call, *, stream: bool) -> httpx.Response:
        """One try: the successful response, or a TxlError."""
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
            response = self._http.send(request, stream=stream)
        except httpx.TransportError as exc:
            raise _core.transport_error(exc, self._options.timeout) from exc
        if response.is_success:
            return response
        try:
            content = response.read()
        except httpx.TransportError:
            content = b""
        response.close()
        raise error_from_response(response.status_code, content, response.headers)


class GenerateStream(Iterator[TokenEvent]):
    """The tokens of a streamed generation, as they arrive; then `result` is the final GenerateResult.

    Use it in a `with` block, or `close()` it, to stop early: the server cancels the generation and commits
    nothing. A transport failure before the first token is retried (same Idempotency-Key); after it, it raises
    TxlConnectionError: `generate(..., idempotency_key=stream.idempotency_key)` then returns the committed
    result if the generation finished, or runs it again if it did not.
    """

    def __init__(
        self,
        client: Client,
        call: _core.Call,
        response: httpx.Response,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self._client, self._call, self._response = client, call, response
        self._on_progress = on_progress
        self.idempotency_key = call.idempotency_key
        self.result: GenerateResult | None = None
        self._texts: list[str] = []
        self._events = self._iterate()

    @property
    def text(self) -> str:
        """The text generated so far."""
        return "".join(self._texts)

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
        retries = 0
        try:
            while True:
                try:
                    for event in _events(self._response, _core.generate_event):
                        if isinstance(event, TokenEvent):
                            self._texts.append(event.text)
                            yield event
                        elif isinstance(event, Progress):
                            if self._on_progress is not None:
                                self._on_progress(event.tokens_done, event.tokens_total)
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
                    self._response.close()
                    time.sleep(delay)
                    retries += 1
                    self._response = self._client._send(self._call, stream=True, lost=error)
        finally:
            self._response.close()


def _events(response: httpx.Response, parse: Callable[[dict[str, Any]], Any]) -> Iterator[Any]:
    """The parsed events of an SSE response up to `[DONE]`; error events raise their TxlError."""
    decoder = _core.SSEDecoder()
    timeout = response.request.extensions.get("timeout", {}).get("read")
    try:
        for line in response.iter_lines():
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
