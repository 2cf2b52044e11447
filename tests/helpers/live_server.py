"""A real uvicorn server on loopback, in a thread of the test process (so tests can also inspect its state), and
the fixtures that start one for a test module."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from txl_server.api.app import create_app
from txl_server.sessions.redis_server import free_port
from txl_server.settings import Settings

from tests.helpers.servers import LoopbackServer, redis_prefix, wait_until_started


class LiveServer(LoopbackServer):
    client_timeout = 30

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.app = create_app(settings)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.server.serve())

    def start(self, timeout: float = 60) -> LiveServer:
        self.thread.start()
        wait_until_started(
            lambda: self.server.started,
            lambda: None if self.thread.is_alive() else "server failed to start",
            timeout=timeout,
            interval=0.02,
        )
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def run(self, coro):
        """Runs a coroutine on the server's event loop (to reach its internals safely)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def live_settings(name: str, **settings: Any) -> Settings:
    """`settings` (a model, a shared Redis' URL, ...), under a fresh key prefix unless they name one."""
    return Settings(**{"redis_prefix": redis_prefix(name), **settings})


def serve(model_dir: Path, redis_url: str, name: str, **settings: Any) -> Iterator[LiveServer]:
    """A live server on `model_dir` and a shared Redis (under a fresh key prefix), for a fixture to
    `yield from`."""
    with LiveServer(live_settings(name, model=model_dir, redis_url=redis_url, **settings)) as live:
        yield live


def client_of(server: LiveServer, key: str | None = None) -> Iterator[httpx.Client]:
    """An HTTP client of `server` with API key `key`, for a fixture to `yield from`."""
    with server.client(key) as client:
        yield client


def live_server_fixture(name: str, *, model: str = "tiny_model_dir", **settings: Any) -> Any:
    """A module's `server` fixture: one live server for the module's tests, on the model directory that the
    fixture `model` gives and the shared Redis, with `settings`."""

    @pytest.fixture(scope="module")
    def server(request: pytest.FixtureRequest, redis_server: Any) -> Iterator[LiveServer]:
        yield from serve(request.getfixturevalue(model), redis_server.url, name, **settings)

    return server


def client_fixture(key: str | None = None) -> Any:
    """A fixture of an HTTP client of the module's `server`, with API key `key`."""

    @pytest.fixture
    def client(server: LiveServer) -> Iterator[httpx.Client]:
        yield from client_of(server, key)

    return client
