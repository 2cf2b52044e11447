"""What the sync and async clients share: options, the requests each method sends, the retry rule, SSE parsing.

The clients themselves only send: `Client` with `httpx.Client`, `AsyncClient` with `httpx.AsyncClient`.

Work that may take long (append, create with text, import, score, generate) is always asked for as a stream: the
server reports progress (or tokens) while it works, and the timeout, httpx's read timeout, bounds the silence
between two events rather than the whole call.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from ._version import __version__
from .errors import (
    Conflict,
    Overloaded,
    TxlConnectionError,
    TxlError,
    TxlTimeoutError,
    Unavailable,
    error_from_body,
)
from .types import GenerateResult, Progress, TokenEvent

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger("txl_client")

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
    timeout: float  # seconds without an answer or progress
    max_retries: int
    retry_overloaded: bool
    retry_conflicts: bool = False
    retries: Retries = field(default_factory=lambda: Retries())  # shared by the clients with_options makes

    @classmethod
    def resolve(
        cls,
        url: str | None,
        api_key: str | None,
        *,
        timeout: float,
        max_retries: int,
        retry_overloaded: bool,
        retry_conflicts: bool = False,
    ) -> Options:
        """Arguments win over TXL_URL / TXL_API_KEY, read now (when the client is made), never at import."""
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        url = url or os.environ.get("TXL_URL") or DEFAULT_URL
        api_key = api_key if api_key is not None else (os.environ.get("TXL_API_KEY") or None)
        return cls(url.rstrip("/"), api_key, timeout, max_retries, retry_overloaded, retry_conflicts)

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
    body: dict[str, Any] | None = None  # sent as JSON
    idempotency_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None  # sent as it is (a snapshot), instead of a JSON body
    params: dict[str, str] = field(default_factory=dict)
    changes_nothing: bool = False  # a POST that only reads (scoring): as safe to send again as a GET

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.idempotency_key is not None:
            headers["Idempotency-Key"] = self.idempotency_key
        session = routed_session(self.path, self.body)
        if session is not None:
            headers[SESSION_HEADER] = session
        return headers

    @property
    def repeatable(self) -> bool:
        """Whether sending it again can never change anything twice: reads, and keyed steps."""
        return self.method in ("GET", "HEAD") or self.changes_nothing or self.idempotency_key is not None


# ---------------------------------------------------------------------------------------------- routing

# A router in front of several replicas keeps a session on one of them by its id: nginx hashes the id in the path,
# or this header for a request that names its session only in the body (deploy/nginx/session-map.conf); an endpoint
# picker, which does not parse paths, reads the header for every session request (deploy/k8s/inference-pool).
# docs/deploy.md, "What a router needs".
SESSION_HEADER = "X-TXL-Session"
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SESSION_PATH = re.compile(r"/v1/sessions/([A-Za-z0-9_-]{1,64})(?:/|$)")
# A response id (/v1/responses) is "resp_" followed by its session's 32-character id, then the response's own part.
_RESPONSE_ID = re.compile(r"resp_([A-Za-z0-9_-]{32})")


def routed_session(path: str, body: dict[str, Any] | None) -> str | None:
    """The session a request works on: the id in its path (/v1/sessions/{id}/...), else the body's `session_id`
    (/v1/completions), else the session of its `previous_response_id` (/v1/responses); None for no session."""
    if m := _SESSION_PATH.match(path):
        return m.group(1)
    if not body:
        return None
    session = body.get("session_id")
    if isinstance(session, str) and _SESSION_ID.fullmatch(session):
        return session
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and (m := _RESPONSE_ID.match(previous)):
        return m.group(1)
    return None


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
    stream: bool = False,
    memory: str | None = None,
) -> Call:
    """Keyed like a step: a retry after a lost response returns the session the first attempt made."""
    body = _compact(text=text, mem_len=mem_len, ttl_seconds=ttl_seconds, metadata=metadata, memory=memory)
    return Call(
        "POST",
        "/v1/sessions",
        {**body, "stream": True} if stream else body,
        idempotency_key=idempotency_key or new_idempotency_key(),
    )


def session_call(method: str, session_id: str, suffix: str = "") -> Call:
    return Call(method, f"/v1/sessions/{_segment(session_id)}{suffix}")


def delete_call(session_id: str, idempotency_key: str | None = None) -> Call:
    """Keyed: a retry after a lost 204 gets the 204 again, not a 404 for the session it deleted."""
    return Call(
        "DELETE",
        f"/v1/sessions/{_segment(session_id)}",
        idempotency_key=idempotency_key or new_idempotency_key(),
    )


def append_call(session_id: str, text: str, idempotency_key: str | None) -> Call:
    """Streamed: progress while a long text is fed."""
    return step_call(session_id, "append", {"text": text, "stream": True}, idempotency_key)


def versions_call(session_id: str) -> Call:
    return session_call("GET", session_id, "/versions")


def rewind_call(session_id: str, version: int, idempotency_key: str | None) -> Call:
    """A step like append: keyed, so a retry after a lost answer does not rewind (and make a version) twice."""
    return step_call(session_id, "rewind", {"version": version}, idempotency_key)


def fork_call(
    session_id: str, metadata: dict[str, Any] | None, version: int | None, idempotency_key: str | None
) -> Call:
    return step_call(
        session_id, "fork", _compact(metadata=metadata, version=version) or None, idempotency_key
    )


def export_call(session_id: str) -> Call:
    return session_call("GET", session_id, "/snapshot")


def import_call(data: bytes, ttl_seconds: int | None, idempotency_key: str | None) -> Call:
    """Streamed, and keyed: a retry after a lost response returns the session the first attempt made."""
    params = {"stream": "true", **({"ttl_seconds": str(ttl_seconds)} if ttl_seconds is not None else {})}
    return Call(
        "POST",
        "/v1/sessions/import",
        idempotency_key=idempotency_key or new_idempotency_key(),
        headers={"Content-Type": "application/octet-stream"},
        content=data,
        params=params,
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


def score_call(text: str, token_logprobs: bool) -> Call:
    """Streamed: progress while the document is read. Not keyed: scoring changes nothing, a retry is harmless."""
    return Call(
        "POST",
        "/v1/score",
        {"text": text, "token_logprobs": token_logprobs, "stream": True},
        changes_nothing=True,
    )


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


# A proxy's answers when a replica failed (502), or did not answer in time (504); and 503, a replica that is
# shutting down or cannot reach Redis. None of them says the request was not started: only keyed or read-only
# calls are sent again, to whichever replica the proxy picks next.
RETRIED_STATUSES = (502, 503, 504)
# A gateway's 502 or 504: the request may have reached a replica that then failed or is still working on it.
LOST_RESPONSE_STATUSES = (502, 504)


def response_lost(error: TxlError) -> bool:
    """Whether `call` may have been started by a server whose answer never arrived."""
    return isinstance(error, TxlConnectionError) or error.status in LOST_RESPONSE_STATUSES


def retry_delay(
    options: Options, call: Call, error: TxlError, *, attempt: int, after_lost_response: bool
) -> float | None:
    """Seconds to wait before retrying `call` after `error` on attempt `attempt` (0-based), or None: raise.
    A retry is counted in `options.retries` and logged (logger "txl_client")."""
    delay = _delay(options, call, error, attempt=attempt, after_lost_response=after_lost_response)
    if delay is not None:
        options.retries.record(call, error, attempt=attempt, of=options.max_retries, delay=delay)
    return delay


def _delay(
    options: Options, call: Call, error: TxlError, *, attempt: int, after_lost_response: bool
) -> float | None:
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
    if isinstance(error, Unavailable) and error.status in RETRIED_STATUSES and call.repeatable:
        return backoff
    if isinstance(error, Overloaded) and options.retry_overloaded:
        return max(error.retry_after or 0.0, backoff)
    if isinstance(error, Conflict) and options.retry_conflicts:
        # Another writer holds the session (or our key's first attempt still runs): nothing was done; wait.
        return max(error.retry_after or 0.0, backoff)
    if isinstance(error, Conflict) and call.idempotency_key is not None and after_lost_response:
        # Our own earlier attempt (whose response was lost) still holds the session or the key: wait for it,
        # then the server replays its result.
        return backoff
    return None


class Retries:
    """The requests a client sent again, by reason: an HTTP status ("502", "409", ...), "connection" or
    "timeout". `client.retries.total`, `client.retries.count("502")`; each is also logged."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()  # clients are shared between threads

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def count(self, reason: str) -> int:
        with self._lock:
            return self._counts[reason]

    def by_reason(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def record(self, call: Call, error: TxlError, *, attempt: int, of: int, delay: float) -> None:
        reason = str(error.status) if error.status is not None else error.type
        with self._lock:
            self._counts[reason] += 1
        # A failed replica or a lost connection is news to an operator; waiting out a busy session is not.
        level = logging.INFO if isinstance(error, Conflict | Overloaded) else logging.WARNING
        log.log(
            level,
            "retrying %s %s in %.2f s (retry %d of %d%s) after %s",
            call.method,
            call.path,
            delay,
            attempt + 1,
            of,
            ", same Idempotency-Key" if call.idempotency_key is not None else "",
            error,
        )


def final_error(error: TxlError, lost: TxlError | None) -> TxlError:
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
