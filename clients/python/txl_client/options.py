"""A client's options: where the server is, the key, the timeout and what may be retried. Arguments win over
TXL_URL / TXL_API_KEY, which are read when a client is made, never at import."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from ._version import __version__
from .retries import Retries

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2


@dataclass(frozen=True)
class Options:
    url: str
    api_key: str | None
    timeout: float  # seconds without an answer or progress
    max_retries: int
    retry_overloaded: bool
    retry_conflicts: bool = False
    retries: Retries = field(default_factory=lambda: Retries())  # shared by the clients with_options makes

    @classmethod
    def resolve(
        cls,
        url: str | None,
        api_key: str | None,
        *,
        timeout: float,
        max_retries: int,
        retry_overloaded: bool,
        retry_conflicts: bool = False,
    ) -> Options:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        url = url or os.environ.get("TXL_URL") or DEFAULT_URL
        api_key = api_key if api_key is not None else (os.environ.get("TXL_API_KEY") or None)
        return cls(url.rstrip("/"), api_key, timeout, max_retries, retry_overloaded, retry_conflicts)

    def with_changes(self, **changes: Any) -> Options:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": f"txl-client/{__version__}", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def httpx_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0))
