"""Waking the event loop from the worker's thread without giving up the GIL on the way.

`loop.call_soon_threadsafe` queues the callback and writes a byte to the loop's self-pipe with `socket.send`, which
releases the GIL around the system call. The loop's thread, woken by that very byte, takes the GIL; the worker,
back from the call, must wait for the loop to give it up again, and for the system to run the worker's thread once
more: on a busy machine, a time slice. It happened once per token, right before the worker's next step.

`wake` queues the callback the same way and writes the byte through libc with the GIL held (`ctypes.PyDLL` keeps
it for the call): the worker goes straight on into the step's native code, which releases the GIL, and the loop
handles the events then. On a one-session stream through a server on a busy 2-core machine, tokens came twice as
fast (docs/benchmarks.md, "One streamed session against the model's own step"). A loop without a self-pipe
socket (another event loop implementation), or a platform without libc's `write`, gets `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
from collections.abc import Callable
from typing import Any


def _libc_write() -> Any:
    """libc's write(2), called with the GIL held; None where it cannot be found."""
    try:
        write = ctypes.PyDLL(None).write
    except (OSError, AttributeError):
        return None
    write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    write.restype = ctypes.c_ssize_t
    return write


_WRITE = _libc_write()


def wake(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any) -> None:
    """`loop.call_soon_threadsafe(callback, *args)`, waking the loop without releasing the GIL where it can.
    RuntimeError where the loop is closed."""
    csock = getattr(loop, "_csock", None)  # asyncio's selector loops: their self-pipe's writing end
    schedule = getattr(loop, "_call_soon", None)
    if _WRITE is None or csock is None or schedule is None:
        loop.call_soon_threadsafe(callback, *args)
        return
    if loop.is_closed():
        raise RuntimeError("Event loop is closed")
    schedule(callback, args, None)  # what call_soon_threadsafe does before its write
    fd = csock.fileno()
    if fd >= 0:  # -1: the loop closed its self-pipe meanwhile (shutting down): nothing to wake
        with contextlib.suppress(OSError):
            _WRITE(fd, b"\0", 1)  # a full pipe (EAGAIN) wakes the loop all the same
