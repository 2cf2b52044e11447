"""Long work (scoring, appending, creating a session with text, importing one) as one JSON answer, or as a stream
that keeps the connection alive while the work runs.

A streamed request answers with SSE: `{"type": "progress", "tokens_done", "tokens_total"}` events a few times a
second while tokens are fed, then `{"type": "result", ...}` holding what the JSON answer would hold, or
`{"type": "error", "error": {...}}`, and `data: [DONE]`. A client's read timeout then measures how long the server
goes without progress, never the length of the work. (No keep-alive without progress: a server that is stuck
must still time its clients out.)

Errors found before the work begins (a bad value, an unknown session, a session busy with another step, no room)
are plain HTTP errors, as for a JSON request: the stream starts once the work reports its first progress (which it
does as soon as it holds what it needs), or finishes, or after `FIRST_EVENT_WAIT_SECONDS` at the latest.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import anyio

from ...sessions.idempotency import IdempotentCall
from . import sse
from .event_stream import EventStream

# Below any sane client timeout, above the time a step may wait for its session's writer.
FIRST_EVENT_WAIT_SECONDS = 15.0

PROGRESS_INTERVAL_SECONDS = 0.2

Progress = Callable[[int, int], None]
Work = Callable[[Progress | None], Awaitable[dict[str, Any]]]


class ProgressThrottle:
    """Progress events a few times a second, and always the last one (done == total)."""

    def __init__(self) -> None:
        self.last = 0.0

    def due(self, done: int, total: int) -> bool:
        now = time.monotonic()
        if done >= total or now - self.last >= PROGRESS_INTERVAL_SECONDS:
            self.last = now
            return True
        return False


def progress_event(done: int, total: int) -> str:
    return sse.event({"type": "progress", "tokens_done": done, "tokens_total": total})


async def long_work(
    work: Work, *, stream: bool, idempotent: IdempotentCall | None = None, status_code: int = 200
) -> Any:
    """`work(progress)`'s JSON answer, or (with `stream`) the response streaming its progress and result.
    `work` reports through `progress(tokens_done, tokens_total)` when given one; with `idempotent`, a retry
    of the request replays the first one's result (as a stream, if this one asks for a stream)."""
    if not stream:
        return await work(None) if idempotent is None else await idempotent.run(lambda: work(None))
    if idempotent is not None and (stored := await idempotent.replay()) is not None:
        return EventStream(replayed_result(stored), status_code=status_code)
    running = RunningWork(work, idempotent)
    try:
        await running.started()
    except BaseException:
        await running.aclose()
        raise
    return EventStream(running, status_code=status_code)


class RunningWork:
    """The work as a task, and its events as an async iterator of SSE text. Closing it (the client left) cancels
    the work: nothing is committed unless its commit had begun (then it completes, and is recorded)."""

    def __init__(self, work: Work, idempotent: IdempotentCall | None) -> None:
        self._progress: list[tuple[int, int]] = []  # reported and not yet sent
        self._news = asyncio.Event()  # set on progress and when the work ends
        throttle = ProgressThrottle()

        def progress(done: int, total: int) -> None:
            if throttle.due(done, total):
                self._progress.append((done, total))
                self._news.set()

        async def run() -> dict[str, Any]:
            # The key's outcome is recorded by the work itself, whether or not anyone reads the stream.
            if idempotent is None:
                return await work(progress)
            return await idempotent.execute(lambda: work(progress))

        self._task = asyncio.ensure_future(run())
        self._task.add_done_callback(lambda _: self._news.set())
        self._events = self._iterate()

    async def started(self) -> None:
        """Returns once the work reported progress or finished (raising its error, if it failed), or after
        FIRST_EVENT_WAIT_SECONDS."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._news.wait(), FIRST_EVENT_WAIT_SECONDS)
        if self._task.done():
            self._task.result()  # raises the work's error, if it failed

    def __aiter__(self) -> AsyncIterator[str]:
        return self._events

    async def aclose(self) -> None:
        # Shielded: when the client leaves, this runs inside a cancelled scope and must still wait for the work's
        # clean-up (its lease and Idempotency-Key released, or its commit completed).
        with anyio.CancelScope(shield=True):
            await self._events.aclose()
            if not self._task.done():
                self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    async def _iterate(self) -> AsyncGenerator[str, None]:
        while True:
            for done, total in self._progress:
                yield progress_event(done, total)
            self._progress.clear()
            if self._task.done():
                break
            self._news.clear()
            await self._news.wait()
        # The work's error, if it failed, ends the stream with its error event, then [DONE] (EventStream).
        yield sse.event({"type": "result", **self._task.result()})
        yield sse.DONE


async def replayed_result(stored: dict[str, Any]) -> AsyncIterator[str]:
    """The stream of a result stored under an Idempotency-Key: its `result` event and the end."""
    yield sse.event({"type": "result", **stored})
    yield sse.DONE
