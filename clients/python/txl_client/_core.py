"""What the sync and async clients share: options, the requests each method sends, the retry rule, SSE parsing.

The clients themselves only send: `Client` with `httpx.Client`, `AsyncClient` with `httpx.AsyncClient`.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from ._version import __version__
from .errors import Conflict, Overloaded, TxlConnectionError, TxlError, TxlTimeoutError, error_from_body
from .types import GenerateResult, Progress, ScoreResult, TokenEvent

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2
BACKOFF_BASE_SECONDS = 0.25
BACKOFF_MAX_SECONDS = 8.0


# ---------------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    url: str
    api_key: str | None
    timeout: float
    max_retries: int
    retry_overloaded: bool

    @classmethod
    def resolve(
        cls,
        url: str | None,
        api_key: str | None,
        *,
        timeout: float,
        max_retries: int,
        retry_overloaded: bool,
    ) -> Options:
        """Arguments win over TXL_URL / TXL_API_KEY, read now (when the client is made), never at import."""
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        url = url or os.environ.get("TXL_URL") or DEFAULT_URL
        api_key = api_key if api_key is not None else (os.environ.get("TXL_API_KEY") or None)
        return cls(url.rstrip("/"), api_key, timeout, max_retries, retry_overloaded)

    def with_changes(self, **changes: Any) -> Options:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": f"txl-client/{__version__}", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def httpx_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0))


# ---------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Call:
    """One logical API call. Its retries send the very same request, Idempotency-Key included, so a retry after
    a lost response cannot change anything twice: reads and scoring change nothing, and everything else is keyed
    (create, delete, fork, append, generate)."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    idempotency_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.idempotency_key is not None:
            headers["Idempotency-Key"] = self.idempotency_key
        return headers


def new_idempotency_key() -> str:
    return "txl-" + uuid.uuid4().hex


def _compact(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def create_session_call(
    text: str,
    mem_len: int | None,
    ttl_seconds: int | None,
    metadata: dict[str, Any] | None,
    idempotency_key: str | None = None,
    *,
    memory: str | None = None,
) -> Call:
    """Keyed like a step: a retry after a lost response returns the session the first attempt made."""
    body = _compact(text=text, mem_len=mem_len, ttl_seconds=ttl_seconds, metadata=metadata, memory=memory)
    return Call("POST", "/v1/sessions", body, idempotency_key=idempotency_key or new_idempotency_key())


def session_call(method: str, session_id: str, suffix: str = "") -> Call:
    return Call(method, f"/v1/sessions/{_segment(session_id)}{suffix}")


def delete_call(session_id: str, idempotency_key: str | None = None) -> Call:
    """Keyed: a retry after a lost 204 gets the 204 again, not a 404 for the session it deleted."""
    return Call(
        "DELETE",
        f"/v1/sessions/{_segment(session_id)}",
        idempotency_key=idempotency_key or new_idempotency_key(),
    )


def step_call(session_id: str, op: str, body: dict[str, Any] | None, idempotency_key: str | None) -> Call:
    """append, generate, fork: always keyed, so that a retry never advances the session twice."""
    return Call(
        "POST",
        f"/v1/sessions/{_segment(session_id)}/{op}",
        body,
        idempotency_key=idempotency_key or new_idempotency_key(),
    )


def generate_body(
    text: str,
    max_tokens: int | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    stop: str | list[str] | None,
    seed: int | None,
    stream: bool,
) -> dict[str, Any]:
    body = _compact(
        text=text or None,
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop=stop,
        seed=seed,
    )
    return {**body, "stream": True} if stream else body


def score_call(text: str, token_logprobs: bool, stream: bool) -> Call:
    body: dict[str, Any] = {"text": text, "token_logprobs": token_logprobs}
    return Call("POST", "/v1/score", {**body, "stream": True} if stream else body)


def _segment(session_id: str) -> str:
    if not session_id or "/" in session_id or session_id in (".", ".."):
        raise ValueError(f"not a session id: {session_id!r}")
    return session_id


# ---------------------------------------------------------------------------------------------- retries


def transport_error(exc: httpx.TransportError, timeout: float | None = None) -> TxlConnectionError:
    """The typed error for a transport failure; `sent` says whether the server may have seen the request."""
    not_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    try:
        url = str(exc.request.url.copy_with(path="/", query=None)).rstrip("/")
    except RuntimeError:  # no request attached
        url = "the server"
    error: TxlConnectionError
    if isinstance(exc, httpx.TimeoutException):
        within = f" within {timeout:g} s" if timeout is not None else ""
        what = "no connection to" if not_sent else "no answer from"
        error = TxlTimeoutError(f"timed out: {what} {url}{within}", sent=not not_sent)
    else:
        what = "cannot reach" if not_sent else "lost the connection to"
        error = TxlConnectionError(f"{what} {url}: {exc or type(exc).__name__}", sent=not not_sent)
    error.__cause__ = exc
    return error


def retry_delay(
    options: Options, call: Call, error: TxlError, *, attempt: int, after_lost_response: bool
) -> float | None:
    """Seconds to wait before retrying `call` after `error` on attempt `attempt` (0-based), or None: raise."""
    if attempt >= options.max_retries:
        return None
    backoff = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2.0**attempt)
    backoff *= random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not security: spreads out clients that retry together
    if isinstance(error, TxlTimeoutError) and error.sent:
        # The server got the request and is slow, not gone: a retry would start the work over (the first
        # attempt is cancelled when its connection closes) and time out again. Raise "timed out" at once.
        return None
    if isinstance(error, TxlConnectionError):
        return backoff
    if isinstance(error, Overloaded) and options.retry_overloaded:
        return max(error.retry_after or 0.0, backoff)
    if isinstance(error, Conflict) and call.idempotency_key is not None and after_lost_response:
        # Our own earlier attempt (whose response was lost) still holds the session or the key: wait for it,
        # then the server replays its result.
        return backoff
    return None


def final_error(error: TxlError, lost: TxlConnectionError | None) -> TxlError:
    """What to raise when a call gives up. A 409 after our own attempt's response was lost (that attempt still
    holds the session or the key) is reported as the loss itself, e.g. "timed out", never as a conflict."""
    if isinstance(error, Conflict) and lost is not None:
        return lost
    return error


# ---------------------------------------------------------------------------------------------- streams


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


DONE = "[DONE]"


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


def score_event(event: dict[str, Any]) -> Progress | ScoreResult | None:
    kind = event.get("type")
    if kind == "progress":
        return Progress.model_validate(event)
    if kind == "result":
        return ScoreResult.model_validate({k: v for k, v in event.items() if k != "type"})
    return None


def ended_early(what: str) -> TxlConnectionError:
    return TxlConnectionError(f"the connection closed before the {what} arrived")
