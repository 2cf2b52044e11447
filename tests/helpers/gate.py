"""A gate in the server's work, for tests that must catch a request while it runs (whatever the machine's speed)."""

from __future__ import annotations

import threading
import time


class Gate:
    """Replaces `owner.name` (e.g. the worker's `runner.run`: one forward of the engine) with a function that holds
    its caller until opened; or, with `delay`, only slows every call down by that many seconds."""

    def __init__(self, owner, name: str, *, delay: float | None = None) -> None:
        self.owner, self.name, self.delay = owner, name, delay
        self.original = getattr(owner, name)
        self.entered, self.opened = threading.Event(), threading.Event()

    def _held(self, *args, **kwargs):
        self.entered.set()
        if self.delay is None:
            self.opened.wait(30)
        else:
            time.sleep(self.delay)
        return self.original(*args, **kwargs)

    def __enter__(self) -> Gate:
        setattr(self.owner, self.name, self._held)
        return self

    def __exit__(self, *exc: object) -> None:
        self.opened.set()
        if isinstance(self.owner, type):
            setattr(self.owner, self.name, self.original)
        else:
            delattr(self.owner, self.name)  # the instance attribute hid the class's method
