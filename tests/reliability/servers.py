"""Real `python -m txl_server` processes for the reliability suite, and the small client-side helpers it shares.

A server runs as a subprocess (its own GIL, its own RSS, killable with SIGKILL), logs to a file the test can read,
and is configured only through `TXL_*` variables, as an operator would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from txl import peak_positions
from txl_server.sessions.redis_server import free_port

REPO = Path(__file__).resolve().parents[2]
BUNDLED_MODEL = REPO / "server" / "txl_server" / "default_model"


class ServerProcess:
    """One server process; `env` holds TXL_* settings (strings). Use as a context manager or call stop()."""

    def __init__(self, log_path: Path, *, port: int | None = None, **env: str) -> None:
        self.port = port or free_port()
        self.log_path = Path(log_path)
        self.env = {
            **os.environ,
            # One torch thread: on a small shared machine, intra-op threads spin against each other (a tiny
            # model's decode step took 17 ms with two threads under load, under 1 ms with one).
            "TXL_THREADS": "1",
            "TXL_LOG_LEVEL": "warning",
            "TXL_PORT": str(self.port),
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 90) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "txl_server"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited at start:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not become ready:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, key: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)

    def async_client(self, key: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60, **kwargs)

    def rss_bytes(self) -> int:
        """The process's resident set size (VmRSS)."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None
        return int(match.group(1)) * 1024

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks run, nothing is flushed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------- models


def session_bytes(model_dir: Path) -> tuple[int, int]:
    """(bytes of a working session on the device at its largest, bytes of a full compacted one) for a model
    directory. A session fed whole segments keeps headroom for a few more, so a working session costs more than
    its `mem_len + tgt_len` positions: budgets sized from the latter fill up with fewer sessions than expected."""
    config = json.loads((model_dir / "config.json").read_text())
    d_head = config.get("d_head") or config["d_model"] // config["n_head"]
    per_position = config["n_layer"] * 2 * config["n_head"] * d_head * 4  # float32 keys and values
    hidden = config["d_model"] * 4
    working = peak_positions(config["mem_len"], config["tgt_len"]) * per_position + hidden
    return working, config["mem_len"] * per_position + hidden


# ---------------------------------------------------------------------------------------------- responses


OPENAI_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models")


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The error object of a response in the one error shape (asserting the shape); on the OpenAI routes, in
    OpenAI's shape, which adds `code` (docs/api.md)."""
    body = response.json()
    url = getattr(response, "url", None) or response.request.url  # httpx, requests, or schemathesis' own
    openai = urlsplit(str(url)).path in OPENAI_ROUTES
    shape = {"type", "message", "param"} | ({"code"} if openai else set())
    # The native shape may carry a `code` too, where one helps (version_not_found, server_shutting_down).
    assert set(body) == {"error"} and set(body["error"]) - {"code"} == shape - {"code"}, body
    return dict(body["error"])


# `type` of an invalid request on the OpenAI routes (elsewhere: "invalid_request").
OPENAI_INVALID = "invalid_request_error"


def sse_payloads(lines: list[str]) -> list[Any]:
    """`data:` payloads of an SSE stream: parsed JSON, or the string "[DONE]"."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_tokens(
    client: httpx.Client, session_id: str, headers: dict[str, str] | None = None, **body: Any
) -> tuple[list[int], dict[str, Any]]:
    """Generates with stream=true; returns the token ids and the final `done` event (token-exact comparisons)."""
    request = {"max_tokens": 16, "temperature": 0, **body, "stream": True}
    with client.stream(
        "POST", f"/v1/sessions/{session_id}/generate", json=request, headers=headers
    ) as response:
        assert response.status_code == 200, response.read().decode()
        events = sse_payloads(list(response.iter_lines()))
    assert events[-1] == "[DONE]" and events[-2]["type"] == "done", events[-3:]
    return [e["token"]["id"] for e in events[:-2] if e["type"] == "token"], events[-2]


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 if absent); labels must match exactly those given."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        base, _, label_text = series.partition("{")
        if base != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', label_text))
        if found == labels:
            return float(value)
    return 0.0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
