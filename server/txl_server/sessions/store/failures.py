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
    MasterDownError,
    NoScriptError,
    OutOfMemoryError,
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
    refusal = _refusal(exc)
    if refusal is not None:
        return refusal
    if isinstance(exc, ConnectionError | OSError):
        return "it cannot be reached" if never_sent(exc) else "the connection to it was lost"
    if isinstance(exc, ResponseError):
        log.warning("Redis answered an error: %s", exc)
        return "it answered with an error"
    return "it failed"


# Error replies with which Redis refuses a command (or a script, at its first write) before changing anything, and
# what each means. A script stopped by another error may have written part of what it meant to.
_REFUSALS = {
    "OOM": "it is out of memory (maxmemory reached: it refuses writes)",
    "READONLY": "it is a read-only replica (a failover may be under way)",
    "LOADING": "it is loading its data after a restart",
    "MASTERDOWN": "its master is down (a failover may be under way)",
    "NOREPLICAS": "it has too few replicas to take writes",
    "NOSCRIPT": "it lost its scripts (a restart or a failover)",
    "BUSY": "it is busy running a script",
}


# redis-py raises these for the codes it knows, with the code cut off the message (a script's "-OOM ..." too).
_REFUSED_AS = {
    OutOfMemoryError: "OOM",
    ReadOnlyError: "READONLY",
    BusyLoadingError: "LOADING",
    MasterDownError: "MASTERDOWN",
    NoScriptError: "NOSCRIPT",
}


def _refusal(exc: BaseException) -> str | None:
    for kind, code in _REFUSED_AS.items():
        if isinstance(
            exc, kind
        ):  # BusyLoadingError is a ConnectionError: asked before the connection's causes
            return _REFUSALS[code]
    if not isinstance(exc, ResponseError):
        return None
    text = str(exc)
    for code, meaning in _REFUSALS.items():
        # As a reply ("OOM command not allowed ...") or inside a script's error ("... -OOM command ...").
        if text.startswith(code + " ") or f"-{code} " in text:
            return meaning
    return None


def never_sent(exc: BaseException) -> bool:
    """Whether the call changed nothing for sure: no connection could be made (redis-py's message for a failed
    connect names it), or Redis refused the command before running it."""
    if isinstance(exc, TimeoutError):
        return False
    if _refusal(exc) is not None:
        return True
    if isinstance(exc, ResponseError):
        return False
    # redis-py's Sentinel client turns a READONLY reply (a demoted master refused the command) into this.
    message = str(exc)
    return (
        "connecting to" in message or "is now a slave" in message or isinstance(exc, ConnectionRefusedError)
    )


def failure(exc: RedisError | OSError, *, store: str, writes: bool, timeout: float | None) -> Unavailable:
    """The error a route answers for a failed call to `store` (e.g. "session store (Redis)")."""
    why = cause(exc, timeout)
    if writes and not never_sent(exc):
        if isinstance(exc, ResponseError):
            return OutcomeUnknown(
                f"the {store} answered an error while applying a change ({exc.__class__.__name__}): the change "
                "may have been applied in part; read the resource again to find out"
            )
        return OutcomeUnknown(
            f"the {store} failed after a change was sent to it ({why}): the change may or may not have been "
            "applied; read the resource again to find out, or retry with the same Idempotency-Key"
        )
    return Unavailable(f"the {store} is unavailable ({why}); nothing was changed")
