"""Graceful shutdown of the HTTP side: stop admitting, let running requests finish, end what cannot.

On SIGTERM/SIGINT the server (`serving.TxlServer`) calls `Shutdown.drain` before uvicorn closes anything:

1. from then on every new API request is answered `503` (type `unavailable`, code `server_shutting_down`, with
   `Connection: close` and Retry-After) and `/ready` is 503, so a load balancer sends traffic elsewhere;
2. running requests (steps, streams) get until the grace period's end (`TXL_SHUTDOWN_GRACE_SECONDS`; in
   persistence `evict`, with sessions to save, its first half: the rest is for saving them);
3. those still running then are stopped: a stream ends with its route's error ending (code
   `server_shutting_down`: the server's `error` event then `data: [DONE]`, OpenAI's error object then
   `data: [DONE]` on completions and chat, an `error` event on the Responses API), a request not yet answered
   gets the 503 (in OpenAI's shape on the OpenAI routes). Stopping cancels their work like a client that left:
   nothing half-done is committed (a commit already begun runs to its end, and its response is sent as
   usual). A second Ctrl-C stops them at once.

Every API request passes through `ShutdownGate`, one ASGI layer: no route knows about shutdown. A stream leaves
its ending in the request's scope (`event_stream.STREAM_ENDING`), and the gate ends a stream it stopped with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .shared import sse
from .shared.event_stream import STREAM_ENDING, native_ending
from .shared.json_response import json_bytes

log = logging.getLogger("txl_server")

SHUTTING_DOWN = "server_shutting_down"
UNAVAILABLE_STATUS = 503
# After the grace period, stopped requests get this long to clean up (release leases, finish a commit begun).
STOP_SECONDS = 5.0
RETRY_AFTER_SECONDS = 1  # behind a load balancer another replica answers; alone, the restarted server


def shutting_down(message: str) -> dict:
    """The error body of a request refused or stopped by the shutdown (the usual shape, plus its code)."""
    return {"type": "unavailable", "code": SHUTTING_DOWN, "message": message, "param": None}


REFUSED = shutting_down("the server is shutting down and takes no new requests; retry shortly")
STOPPED = shutting_down(
    "the server is shutting down and stopped this request before its end; nothing it computed was kept: "
    "retry it (with an Idempotency-Key, safely)"
)


@dataclass
class InFlight:
    started: bool = False  # the response's status line is sent
    streaming: bool = False  # ... and it is a server-sent event stream
    finished: bool = False  # its last byte is sent
    stopped: bool = False  # cancelled by the shutdown


class Shutdown:
    """The app's shutdown state (`app.state.shutdown`), and the requests it waits for."""

    def __init__(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        self.closing = False
        self.deadline: float | None = None  # time.monotonic() by which everything is done
        self.on_begin: Callable[[], None] = lambda: None  # the runtime stops saying it is ready
        self.reserve: Callable[[], float] = lambda: 0.0  # seconds kept after the requests (saving sessions)
        self._running: dict[asyncio.Future[None], InFlight] = {}
        self._hurry: asyncio.Event | None = None

    @property
    def running(self) -> int:
        return len(self._running)

    def hurry(self) -> None:
        """Stop waiting for the running requests (a second Ctrl-C)."""
        if self._hurry is not None and not self._hurry.is_set():
            log.info("stopping the running requests now")
            self._hurry.set()

    async def drain(self) -> None:
        if self.closing:
            return
        self.closing = True
        self._hurry = asyncio.Event()
        self.deadline = time.monotonic() + self.grace_seconds
        self.on_begin()
        until = self.deadline - min(self.reserve(), self.grace_seconds)
        if self._running:
            log.info(
                "shutting down: no new requests; waiting up to %.0f s for %d running (Ctrl-C again to stop them)",
                max(0.0, until - time.monotonic()),
                len(self._running),
            )
            await self._wait(until)
        stopped = [(task, request) for task, request in self._running.items() if self._stop(task, request)]
        if stopped:
            log.info(
                "stopped %d requests still running %s (streams ended with %s; nothing they computed was kept)",
                len(stopped),
                self._why_stopped(until),
                SHUTTING_DOWN,
            )
            await asyncio.wait([task for task, _ in stopped], timeout=STOP_SECONDS)

    def _why_stopped(self, until: float) -> str:
        """When the running requests were stopped, as it happened: a second signal cuts the wait short."""
        assert self._hurry is not None
        left = until - time.monotonic()
        if self._hurry.is_set() and left > 0:
            return f"at a second Ctrl-C (or signal), {left:.0f} s before the end of the grace period"
        assert self.deadline is not None
        saving = self.deadline - until
        if saving > 0:
            return (
                f"at the end of the grace period's {self.grace_seconds - saving:g} s for requests (the other "
                f"{saving:g} s are for saving sessions)"
            )
        return f"at the end of the grace period ({self.grace_seconds:g} s)"

    async def _wait(self, until: float) -> None:
        assert self._hurry is not None
        hurry: asyncio.Future[Any] = asyncio.ensure_future(self._hurry.wait())
        try:
            while self._running and not self._hurry.is_set():
                left = until - time.monotonic()
                if left <= 0:
                    return
                waited: set[asyncio.Future[Any]] = {hurry, *self._running}
                await asyncio.wait(waited, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurry.cancel()

    @staticmethod
    def _stop(task: asyncio.Future[None], request: InFlight) -> bool:
        """Cancels a request that can still be ended cleanly: not answered yet, or an open stream. (A plain
        response being written finishes by itself.)"""
        if request.finished or (request.started and not request.streaming):
            return False
        request.stopped = True
        task.cancel()
        return True

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Serves one API request as a task the shutdown can wait for, and stop."""
        request = InFlight()

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                request.started = True
                request.streaming = _content_type(message).startswith(sse.MEDIA_TYPE)
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                request.finished = True
            await send(message)

        task = asyncio.ensure_future(app(scope, receive, watched))
        self._running[task] = request
        try:
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError:  # the server itself is cancelling us: the request goes too
                task.cancel()
                raise
        finally:
            del self._running[task]
        if not request.stopped:
            task.result()  # the app's own outcome, errors included, as uvicorn would have seen it
            return
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        if request.finished:  # it completed anyway (a commit that had begun runs to its end)
            return
        if request.started:
            ending = scope.get(STREAM_ENDING, native_ending)
            await send({"type": "http.response.body", "body": ending(UNAVAILABLE_STATUS, STOPPED).encode()})
        else:
            await _send_error(send, STOPPED)


class ShutdownGate:
    """Refuses new API requests once the shutdown began; runs the others under `Shutdown.run`."""

    def __init__(self, app: ASGIApp, shutdown: Shutdown) -> None:
        self.app, self.shutdown = app, shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (scope["path"] == "/v1" or scope["path"].startswith("/v1/")):
            await self.app(scope, receive, send)  # the playground, /health, /ready (which says not ready)
        elif self.shutdown.closing:
            await _send_error(send, REFUSED)
        else:
            await self.shutdown.run(self.app, scope, receive, send)


async def _send_error(send: Send, error: dict) -> None:
    body = json_bytes({"error": error})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": UNAVAILABLE_STATUS, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _content_type(message: Message) -> str:
    for name, value in message.get("headers", []):
        if name.lower() == b"content-type":
            return bytes(value).decode("latin-1")
    return ""
