"""Ends a server process that can no longer serve, so that whatever supervises it starts a new one.

`/health` fails when the device failed or the worker is stuck (`Runtime.liveness`), and Kubernetes restarts a pod
whose liveness probe fails; but Docker and compose only mark such a container unhealthy, and their restart
policies act on exits. So `python -m txl_server` (not an app embedded in another process: tests, or an ASGI host
of the user's) watches its own liveness and exits with EXIT_NOT_ALIVE once it has failed for `confirm_seconds`
(the failing request's error answer leaves first): Docker's `--restart on-failure`, compose's `restart`, systemd
and Kubernetes each start the server again. Committed sessions continue after the restart, as after `kill -9`.

A thread, not a task of the event loop: a deadlock that holds the loop must not hold the watchdog too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# The exit status of a process that ended itself because it was not alive (2 is a refused start-up).
EXIT_NOT_ALIVE = 3


class Watchdog:
    """Calls `liveness` every `interval` seconds; once it has named a reason for `confirm_seconds` without a
    break, logs it and calls `exit_process(EXIT_NOT_ALIVE)`."""

    def __init__(
        self,
        liveness: Callable[[], str | None],
        exit_process: Callable[[int], None],
        *,
        interval: float = 1.0,
        confirm_seconds: float = 2.0,
    ) -> None:
        self.liveness = liveness
        self.exit_process = exit_process
        self.interval = interval
        self.confirm_seconds = confirm_seconds
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="txl-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        failing_since: float | None = None
        while not self._stopped.wait(self.interval):
            reason = self.liveness()
            if reason is None:
                failing_since = None
                continue
            now = time.monotonic()
            if failing_since is None:
                failing_since = now
            if now - failing_since >= self.confirm_seconds and not self._stopped.is_set():
                log.critical(
                    "not alive: %s; exiting with status %d so that the supervisor (Docker's restart policy, "
                    "compose, systemd, Kubernetes) starts the server again",
                    reason,
                    EXIT_NOT_ALIVE,
                )
                self.exit_process(EXIT_NOT_ALIVE)
                return
