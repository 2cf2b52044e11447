"""A real uvicorn server on loopback, in a thread of the test process (so tests can also inspect its state)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from txl_server.api.app import create_app
from txl_server.sessions.redis_server import free_port
from txl_server.settings import Settings


class LiveServer:
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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.started:
                return self
            if not self.thread.is_alive():
                raise RuntimeError("server failed to start")
            time.sleep(0.02)
        raise RuntimeError("server did not start in time")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def run(self, coro):
        """Runs a coroutine on the server's event loop (to reach its internals safely)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def client(self, key: str | None = None, **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(model_dir: Path, redis_url: str, prefix: str, **settings: Any) -> Iterator[LiveServer]:
    """A live server on `model_dir` and a shared Redis (under a fresh key prefix), for a fixture to
    `yield from`."""
    values = dict(model=model_dir, redis_url=redis_url, redis_prefix=f"{prefix}-{uuid.uuid4().hex[:6]}:")
    with LiveServer(Settings(**{**values, **settings})) as live:
        yield live


def client_of(server: LiveServer, key: str | None = None) -> Iterator[httpx.Client]:
    """An HTTP client of `server` with API key `key`, for a fixture to `yield from`."""
    with server.client(key) as client:
        yield client
