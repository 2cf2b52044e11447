"""While a request waits for its first token: a line on stderr that says how long it has waited and what the server
is doing meanwhile (`GET /v1/system`: the requests its worker runs), so that a request waiting beside long work
(a long document scored, read or appended) does not look hung.

It says nothing for the first second (most requests answer sooner), and gives way to the text, or to the prompt's
progress bar, as soon as the server sends anything (`stop`).
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

from ..client import Client
from ..errors import TxlError
from ..types import Work

QUIET_SECONDS = 1.0  # before the line appears
REDRAW_SECONDS = 0.5
ASK_SECONDS = 2.0  # between two questions to the server


class Waiting:
    """`waiting = Waiting(client, sys.stderr).start()`, then `waiting.stop()` at the first token or progress."""

    def __init__(self, client: Client, stream: TextIO, what: str = "the first token") -> None:
        # The server is asked with its own short timeout and no retries: a slow answer only leaves a line unsaid.
        self.client = client.with_options(timeout=ASK_SECONDS, max_retries=0)
        self.stream, self.what = stream, what
        self.drawn = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txl-waiting", daemon=True)

    def start(self) -> Waiting:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Idempotent; clears the line if one was drawn."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._thread.join()
        if self.drawn:
            self.stream.write("\r\x1b[K" if self.stream.isatty() else "\n")
            self.stream.flush()

    def line(self, seconds: float, work: Work | None) -> str:
        said = f"waiting for {self.what}: {seconds:.0f} s"
        if work is not None and work.requests_running + work.requests_waiting:
            running = work.requests_running
            said += f"; the server is running {running} {'request' if running == 1 else 'requests'}"
            if work.requests_waiting:
                said += f", {work.requests_waiting} more waiting to start"
            said += " (long work shares the device)"
        return said

    def _run(self) -> None:
        started = time.monotonic()
        asked, work = float("-inf"), None
        if self._stopped.wait(QUIET_SECONDS):
            return
        while not self._stopped.is_set():
            now = time.monotonic()
            if now - asked >= ASK_SECONDS:
                asked = now
                try:
                    work = self.client.system().work
                except TxlError:
                    work = None
            if self._stopped.is_set():
                return
            self.stream.write(("\r\x1b[K" if self.stream.isatty() else "\n") + self.line(now - started, work))
            self.stream.flush()
            self.drawn = True
            self._stopped.wait(REDRAW_SECONDS)
