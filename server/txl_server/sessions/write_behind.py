"""Write-behind: the blocks of versions committed ahead of them, written after the answer.

A step that fed few tokens is committed as the version before it and those tokens (persistence.py, `ahead`): it is
durable in Redis once answered, and its blocks are written here, shortly after, off the answer's path. A session's
newest such version waits `delay` seconds (TXL_WRITE_BEHIND_DELAY_MS: the answer's own last work, its response
record and its events, runs first), then its blocks are written and settle it in Redis (`settle`); a newer version
of the same session arriving meanwhile takes its place (a burst of steps, a stream of appends, writes its blocks
once). A version left unsettled
(superseded, or its write failed, or the process died first) stays readable: its reader feeds its tokens again after
the blocks it names, at most TXL_WRITE_BEHIND_TOKENS of them.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ..engine.state import ModelState, released
from ..telemetry.spans import linked
from .store.versions import VersionSummary

log = logging.getLogger(__name__)

# How long a committed version waits before its blocks are written (the default of TXL_WRITE_BEHIND_DELAY_MS):
# long enough that the answer it belongs to finishes first (its last events are sent within a few milliseconds),
# short enough that a reader on another replica rarely has to feed tokens again.
DELAY_SECONDS = 0.05


@dataclass(frozen=True)
class Pending:
    """A version committed ahead of its blocks, waiting for them: its session, summary, state (a hold) and TTL,
    and the context of the request that committed it (its write's trace links to that request's)."""

    session_id: str
    summary: VersionSummary
    state: ModelState
    ttl: int
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


class WriteBehind:
    def __init__(
        self, settle: Callable[[Pending], Coroutine[Any, Any, None]], *, delay: float = DELAY_SECONDS
    ) -> None:
        self._settle = settle
        self.delay = delay
        self._pending: dict[str, Pending] = {}  # per session, its newest version not written yet
        # Per session waiting, what writes it after the delay; per session, its write under way.
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._writing: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # writes under way (and timers)

    def __len__(self) -> int:
        """Versions waiting for their blocks, or being written."""
        return len(self._pending) + len(self._writing)

    def add(self, pending: Pending) -> None:
        """Writes `pending`'s blocks after the delay (its state is a hold, which this takes); an older version of
        its session still waiting is left as it is (its blocks are not written)."""
        older = self._pending.get(pending.session_id)
        self._pending[pending.session_id] = pending
        if older is not None:
            older.state.release()
            return  # its timer writes the newest
        self._timers[pending.session_id] = self._start(self._after_delay(pending.session_id))

    async def forget(self, session_id: str) -> None:
        """A deleted session: its version waiting is not written (its state let go at once), and a write of it under
        way ends before this returns (its blocks then belong to no version: the sweeper collects them)."""
        pending = self._pending.pop(session_id, None)
        if pending is not None:
            self._timers.pop(session_id).cancel()
            pending.state.release()
        writing = self._writing.get(session_id)
        if writing is not None:
            await asyncio.wait([writing])

    async def flush(self, timeout: float) -> None:
        """Writes every waiting version now, and waits up to `timeout` seconds for all writes (at shutdown)."""
        for session_id in list(self._pending):
            self._timers.pop(session_id).cancel()
            self._write_now(session_id)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=max(0.0, timeout))

    def _start(
        self, work: Coroutine[Any, Any, None], context: contextvars.Context | None = None
    ) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work, context=context)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _after_delay(self, session_id: str) -> None:
        await asyncio.sleep(self.delay)
        del self._timers[session_id]
        self._write_now(session_id)

    def _write_now(self, session_id: str) -> None:
        """Starts writing the session's version waiting, in the context of the request that committed it."""
        pending = self._pending.pop(session_id)
        self._writing[session_id] = self._start(self._write(pending), pending.context)

    async def _write(self, pending: Pending) -> None:
        session_id = pending.session_id
        task = asyncio.current_task()
        attributes = {"session.id": session_id, "txl.session.version": pending.summary.version}
        try:
            with released(pending.state):
                # A trace of its own, linked to the request that committed the version (it outlives it).
                await linked("session.write_behind", self._settle(pending), attributes)
        except Exception as exc:
            log.warning(
                "the blocks of version %d of session %s were not written (%s): it is read back by feeding its "
                "last tokens again",
                pending.summary.version,
                session_id,
                exc,
            )
        finally:
            if self._writing.get(session_id) is task:
                del self._writing[session_id]
