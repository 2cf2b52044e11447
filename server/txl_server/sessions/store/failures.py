"""What a failed Redis call means for the request that made it: the store never says "nothing was changed" unless
that is known.

A call that never reached Redis (no connection could be made), or that Redis refused before running it (out of
memory under `noeviction`, a read-only replica, still loading), changed nothing. A change that was sent and then
got no answer (a timeout, a connection lost after sending) may or may not have been applied: Redis may run it
the moment it comes back. Such a call raises `OutcomeUnknown`, never "nothing was changed"; the session step turns
it into the truth by asking Redis once it answers (sessions/step.py), and fences the change off so that a late
arrival cannot apply it after the answer was given (the single-writer lease: lua/session_commit.lua).

Every message names the real cause, without internals (no addresses).
"""

from __future__ import annotations

import logging

from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ConnectionError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TimeoutError,
)

from ...errors import OutcomeUnknown, Unavailable

log = logging.getLogger(__name__)


def cause(exc: BaseException, timeout: float | None) -> str:
    """Why Redis did not serve a call, in words for the client."""
    if isinstance(exc, TimeoutError):
        return f"it did not answer within {timeout:g} s" if timeout else "it did not answer in time"
    if isinstance(exc, AuthenticationError):
        return "it refused the server's credentials"
    if isinstance(exc, ConnectionError | OSError):
        return "it cannot be reached" if never_sent(exc) else "the connection to it was lost"
    if isinstance(exc, ReadOnlyError):
        return "it is a read-only replica (a failover may be under way)"
    if isinstance(exc, BusyLoadingError):
        return "it is loading its data after a restart"
    if isinstance(exc, ResponseError):
        text = str(exc)
        if text.startswith("OOM"):
            return "it is out of memory (maxmemory reached: it refuses writes)"
        if text.startswith(("MASTERDOWN", "NOREPLICAS")):
            return "its master is down (a failover may be under way)"
        log.warning("Redis answered an error: %s", text)
        return "it answered with an error"
    return "it failed"


def never_sent(exc: BaseException) -> bool:
    """Whether the call failed before anything was sent: no connection could be made (redis-py's message for a
    failed connect names it), or Redis refused the command before running it (an error reply)."""
    if isinstance(exc, TimeoutError):
        return False
    if isinstance(exc, ResponseError):
        return True  # an error reply: Redis refused it whole (scripts are atomic)
    # redis-py's Sentinel client turns a READONLY reply (a demoted master refused the command) into this.
    message = str(exc)
    return (
        "connecting to" in message or "is now a slave" in message or isinstance(exc, ConnectionRefusedError)
    )


def failure(exc: RedisError | OSError, *, store: str, writes: bool, timeout: float | None) -> Unavailable:
    """The error a route answers for a failed call to `store` (e.g. "session store (Redis)")."""
    why = cause(exc, timeout)
    if writes and not never_sent(exc):
        return OutcomeUnknown(
            f"the {store} failed after a change was sent to it ({why}): the change may or may not have been "
            "applied; read the resource again to find out, or retry with the same Idempotency-Key"
        )
    return Unavailable(f"the {store} is unavailable ({why}); nothing was changed")
