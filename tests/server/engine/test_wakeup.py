"""Waking the event loop from another thread, the GIL kept (engine/wakeup.py): every callback runs, in order, on a
loop that was asleep with nothing else to wake it; other loops get `call_soon_threadsafe`; a closed loop refuses."""

from __future__ import annotations

import asyncio
import threading

import pytest
from txl_server.engine import wakeup
from txl_server.engine.wakeup import wake


async def test_a_sleeping_loop_runs_every_callback_in_order():
    loop = asyncio.get_running_loop()
    seen: list[int] = []
    done = asyncio.Event()

    def note(i: int) -> None:
        seen.append(i)
        if i == 999:
            done.set()

    def from_a_thread() -> None:
        for i in range(1000):
            wake(loop, note, i)

    assert wakeup._WRITE is not None and getattr(loop, "_csock", None) is not None  # the path under test
    thread = threading.Thread(target=from_a_thread)
    thread.start()
    # Nothing else wakes this loop: without the wake-up byte it would sleep through the timeout.
    await asyncio.wait_for(done.wait(), timeout=10)
    thread.join()
    assert seen == list(range(1000))


def test_a_loop_without_a_self_pipe_gets_call_soon_threadsafe():
    class OtherLoop:  # another event loop implementation (uvloop has no `_csock`)
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def call_soon_threadsafe(self, callback, *args) -> None:
            self.calls.append((callback, args))

    other = OtherLoop()
    wake(other, print, "x")  # type: ignore[arg-type]
    assert other.calls == [(print, ("x",))]


def test_a_closed_loop_refuses_as_call_soon_threadsafe_does():
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        wake(loop, print)
