"""`python -m txl_server` as a real process (signals, `kill -9`, its own embedded Redis), its log in a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from txl_server.sessions.redis_server import free_port

REPO = Path(__file__).resolve().parents[2]


class ServerProcess:
    def __init__(self, model_dir: Path, log_path: Path, **env: str) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TXL_")},
            "TXL_MODEL": str(model_dir),
            "TXL_PORT": str(self.port),
            "TXL_THREADS": "1",
            "TXL_LOG_LEVEL": "info",
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self._log_from = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90) -> ServerProcess:
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
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
                raise RuntimeError(f"the server exited at start:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"the server did not become ready:\n{self.log()}")

    def log(self) -> str:
        """What this run (since the last start) wrote."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_from)
            return log.read().decode(errors="replace")

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def terminate(self, timeout: float = 60) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait()

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)

    def ensure_stopped(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
