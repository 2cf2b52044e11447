"""Long work beside a request under test: a slow score on the server, running while the block runs."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from tests.helpers.gate import Gate


@contextlib.contextmanager
def beside_long_work(server: Any, sdk: Any, *, forwards: int = 40, delay: float = 0.8) -> Iterator[None]:
    """Inside the block the server scores a text of about `forwards` segments of the tiny byte model (8 tokens),
    each forward of its engine slowed by `delay` seconds, so that what the block starts waits beside it, however
    long a loaded machine takes to start it. The block begins once the score runs; when it ends the forwards run at
    full speed again, and the score is over soon after."""
    runner = server.app.state.runtime.service.worker.runner  # each call: one forward of the engine
    # A text no earlier request began with: the prefix cache would serve a repeated one at once.
    text = (uuid.uuid4().hex + " It was the best of times, it was the worst of times." * forwards)[
        : 8 * forwards - 4
    ]
    scoring = threading.Thread(target=sdk.score, args=(text,))
    with Gate(runner, "run", delay=delay):
        before = sdk.system().work.requests_running  # what an earlier test left finishing
        scoring.start()
        deadline = time.monotonic() + 10
        while sdk.system().work.requests_running <= before and time.monotonic() < deadline:
            time.sleep(0.05)
        yield
    scoring.join(timeout=120)
