"""What every test server has, in this process (live_server.py) or as a process of its own (server_process.py):
a loopback port, HTTP clients of it, and one way to wait for it to start."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx


def redis_prefix(name: str) -> str:
    """A fresh key prefix, so that servers sharing one Redis never see each other's keys."""
    return f"{name}-{uuid.uuid4().hex[:8]}:"


def wait_until_started(
    started: Callable[[], bool], failed: Callable[[], str | None], *, timeout: float, interval: float
) -> None:
    """Polls `started` until it holds. Raises RuntimeError with what `failed` says once it says something (the
    server died), or when `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if started():
            return
        if (why := failed()) is not None:
            raise RuntimeError(why)
        time.sleep(interval)
    raise RuntimeError("the server did not start in time")


class LoopbackServer:
    """A server on 127.0.0.1:`port`, and HTTP clients of it that send an API key when given one."""

    port: int
    client_timeout: float  # seconds

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, key: str | None = None, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=_auth(key), timeout=self.client_timeout, **kwargs)

    def async_client(self, key: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=_auth(key), timeout=self.client_timeout, **kwargs)


def _auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}
