"""The HTTP server process around the app: its listening sockets, taken before anything slow, and uvicorn's
server with start-up and shutdown the way this server wants them.

- The port is taken (bound and listening) before the model loads or Redis starts: a port in use is one line and
  exit status 2 at once, not uvicorn's raw `[Errno 98]` after seconds of loading. Connections made meanwhile
  wait in the socket's queue and are answered once the server starts.
- Listening beyond loopback without API keys (e.g. `--host 0.0.0.0`, the Docker image's default) is said at once,
  as a warning: anyone who reaches the address can then use every session.
- Once it answers, the log ends with where to go.
- A connection must send its request's head (line and headers) within TXL_HEADER_TIMEOUT_SECONDS of opening
  (or of its previous answer), else it is closed (`HeadDeadline`): idle connections and headers sent a byte at
  a time hold nothing for long. (uvicorn itself never times out a connection that has sent nothing yet, and
  restarts its keep-alive wait at every byte.) The body's deadline is the app's (api/middleware.py).
- SIGTERM/SIGINT drain the app first (`api/shutdown.py`: no new requests, running ones finish within the grace
  period, open streams end with an error event), then uvicorn closes the connections and the lifespan stops
  the runtime (which saves the sessions held in memory). A second signal stops waiting for requests. The
  signals are not raised again afterwards: a clean shutdown exits 0, without a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .watchdog import Watchdog

log = logging.getLogger("txl_server")


BACKLOG = 2048  # uvicorn's default


class PortUnavailable(OSError):
    """The address cannot be bound (in use, or not allowed)."""


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address `host` resolves to, as uvicorn would make them. Listening at once, not
    only bound: two sockets with SO_REUSEADDR may both bind a port nobody listens on. Raises PortUnavailable."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PortUnavailable(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sockets: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: "::" is IPv6 only, "0.0.0.0" its own socket
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        why = "the address is already in use" if exc.errno == 98 else (exc.strerror or str(exc))
        raise PortUnavailable(f"cannot listen on {host}:{port}: {why}") from exc
    return sockets


def beyond_loopback(sockets: list[socket.socket]) -> list[str]:
    """The addresses of `sockets` that other machines may reach (not loopback), as host:port."""
    reachable = []
    for sock in sockets:
        host, port = sock.getsockname()[:2]
        if not ipaddress.ip_address(host.split("%")[0]).is_loopback:
            reachable.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return reachable


def warn_if_open(sockets: list[socket.socket], *, has_api_keys: bool) -> None:
    """A warning when other machines may reach the server and no API key is required."""
    reachable = beyond_loopback(sockets)
    if reachable and not has_api_keys:
        log.warning(
            "listening on %s without API keys: anyone who can reach it can read, change and delete every "
            "session. Set TXL_API_KEYS (or TXL_API_KEYS_FILE), or listen on loopback only (--host 127.0.0.1)",
            ", ".join(reachable),
        )


class HeadDeadline(H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request's head: `seconds` from the connection (or from
    the previous answer) to the end of the head's headers, however slowly its bytes come. Past it the connection
    is closed. A request being answered has no deadline (its body has the app's)."""

    seconds = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        """Waits for the next head: a request cycle other than this one means it came."""
        self._disarm()
        self._waiting_after = self.cycle
        self._head_timer = self.loop.call_later(self.seconds, self._too_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def handle_events(self) -> None:
        super().handle_events()
        if self._head_timer is not None and self.cycle is not self._waiting_after:
            self._disarm()  # a head came whole: its request has begun

    def on_response_complete(self) -> None:
        self._arm()  # before uvicorn handles a pipelined request (which disarms it)
        super().on_response_complete()
        if self.transport.is_closing():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _too_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def head_deadline(seconds: float) -> type[HeadDeadline]:
    """The protocol class for uvicorn's `http`, with this deadline."""
    return type("HeadDeadline", (HeadDeadline,), {"seconds": seconds})


class TxlServer(uvicorn.Server):
    """uvicorn's server, announcing where to go once it answers and draining the app before it shuts down; with
    `exit_process`, a watchdog ends the process once the app's runtime is no longer alive (watchdog.py)."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        ready_message: str,
        exit_process: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.ready_message = ready_message
        self.exit_process = exit_process
        self.watchdog: Watchdog | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            if sockets is not None:  # uvicorn announces only the sockets it bound itself
                with contextlib.suppress(AttributeError):
                    self._log_started_message(sockets)
            log.info("%s", self.ready_message)
            self._watch()

    def _watch(self) -> None:
        runtime = getattr(getattr(self.config.app, "state", None), "runtime", None)
        if self.exit_process is None or runtime is None or not runtime.settings.exit_when_not_alive:
            return
        self.watchdog = Watchdog(runtime.liveness, self.exit_process)
        self.watchdog.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.watchdog is not None:  # a shutdown asked for ends the process its own way
            self.watchdog.stop()
        drain = getattr(getattr(self.config.app, "state", None), "shutdown", None)
        if drain is not None:
            await drain.drain()
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        drain = getattr(getattr(self.config.app, "state", None), "shutdown", None)
        if self.should_exit and drain is not None:
            drain.hurry()  # a second Ctrl-C: stop the remaining requests now
            return
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, without raising the signals again once the server has stopped (which would end a clean
        shutdown in a KeyboardInterrupt traceback, or a death by SIGTERM)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous: dict[int, Any] = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
