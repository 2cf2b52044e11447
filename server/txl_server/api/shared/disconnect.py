"""Requests that do not stream stop when their client leaves.

A stream notices a closed connection when it next writes (`EventStream`). A request that answers once, at the end
(create, append, a generation without `stream`, scoring, completions, import), writes nothing until it is done, so
it watches its connection instead: the handler runs as a task beside a watcher that waits for the connection's
`http.disconnect`, and cancels the task when it comes. The cancellation reaches the service where the work
awaits: the worker's job is cancelled (`run_job`), the session's lease and any Idempotency-Key are released, and
nothing is committed or registered. The request is recorded with nginx's status 499 (client closed request),
which no client ever sees.

Routes opt in with `@watch_connection`, on a router made with `route_class=WatchedRoute`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.types import Receive

log = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499
_WATCH = "_txl_watch_connection"

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


class ClientGone(Exception):
    """The client closed the connection before the response: its work was cancelled."""


def watch_connection(endpoint: Endpoint) -> Endpoint:
    """Marks a route whose work is cancelled when the client disconnects before the response starts."""
    setattr(endpoint, _WATCH, True)
    return endpoint


class WatchedRoute(APIRoute):
    """Runs the handlers of `@watch_connection` routes under `until_disconnected`: from body parsing to the
    response object (for a stream, until its first event; then `EventStream` watches)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if not getattr(self.endpoint, _WATCH, False):
            return handler

        async def watched(request: Request) -> Response:
            # The body first (it is kept on the request for the handler): once it is read, the only message the
            # connection can still send is its end, so the watcher cannot take a piece of the body.
            await request.body()
            return await until_disconnected(request.receive, handler(request))

        return watched


async def until_disconnected(receive: Receive, work: Awaitable[Response]) -> Response:
    """The response of `work`; raises ClientGone if the connection ends first (after cancelling `work` and
    waiting for its clean-up, so that a retry finds the session's lease and the Idempotency-Key released)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server itself is stopping: stop the work too
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    if watcher.exception() is not None:  # the connection cannot be watched: just wait for the work
        log.warning("cannot watch the connection: %r", watcher.exception())
        return await task
    task.cancel()
    await asyncio.wait({task})
    if task.cancelled() or task.exception() is not None:
        raise ClientGone
    return task.result()  # it finished anyway: its commit had begun, and a commit is never cut in half


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
