"""The retry rule both clients follow: what is sent again, after how long, and what is raised when they give up.

Only what can never change anything twice is sent again after the server may have seen it: reads, scoring and
keyed steps (calls.py). A transport failure becomes a typed error here, saying whether the request was sent.
"""

from __future__ import annotations

import random

import httpx

from .calls import Call
from .errors import Conflict, Overloaded, TxlConnectionError, TxlError, TxlTimeoutError, Unavailable
from .options import Options

BACKOFF_BASE_SECONDS = 0.25
BACKOFF_MAX_SECONDS = 8.0

# A proxy's answers when a replica failed (502), or did not answer in time (504); and 503, a replica that is
# shutting down or cannot reach Redis. None of them says the request was not started: only keyed or read-only
# calls are sent again, to whichever replica the proxy picks next.
RETRIED_STATUSES = (502, 503, 504)
# A gateway's 502 or 504: the request may have reached a replica that then failed or is still working on it.
LOST_RESPONSE_STATUSES = (502, 504)


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


def final_error(error: TxlError, lost: TxlError | None) -> TxlError:
    """What to raise when a call gives up. A 409 after our own attempt's response was lost (that attempt still
    holds the session or the key) is reported as the loss itself, e.g. "timed out", never as a conflict."""
    if isinstance(error, Conflict) and lost is not None:
        return lost
    return error


class Retrying:
    """The attempts of one call: after each failure, how long to wait before the next, or the error to give up
    with. The clients only sleep (`time.sleep` or `asyncio.sleep`) and try again."""

    def __init__(self, options: Options, call: Call, *, lost: TxlError | None = None) -> None:
        self.options, self.call = options, call
        self.lost = lost  # the error of an attempt whose response was lost, if one was
        self.attempts = 0

    def wait_after(self, error: TxlError) -> float:
        """Seconds to wait before attempting again after `error`; raises the error to give up with."""
        if response_lost(error):
            self.lost = error
        delay = retry_delay(
            self.options, self.call, error, attempt=self.attempts, after_lost_response=self.lost is not None
        )
        if delay is None:
            raise final_error(error, self.lost)
        self.attempts += 1
        return delay
