"""`client.retries`: the requests a client sent again, counted by reason and logged (logger "txl_client")."""

from __future__ import annotations

import logging
import threading
from collections import Counter

from .calls import Call
from .errors import Conflict, Overloaded, TxlError

log = logging.getLogger("txl_client")


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
