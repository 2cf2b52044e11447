"""`python -m txl_server` as a real process: its own GIL and RSS, signals, `kill -9`, its log in a file, and
configured only through TXL_* variables, as an operator would."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from txl_server.sessions.redis_server import free_port

from tests.helpers.servers import LoopbackServer, redis_prefix, wait_until_started

REPO = Path(__file__).resolve().parents[2]


def process_env(model_dir: Path, redis_url: str, name: str) -> dict[str, str]:
    """The TXL_* variables of a server on `model_dir` and a shared Redis, under a fresh key prefix."""
    return {"TXL_MODEL": str(model_dir), "TXL_REDIS_URL": redis_url, "TXL_REDIS_PREFIX": redis_prefix(name)}


class ServerProcess(LoopbackServer):
    """One server process; `env` holds TXL_* settings (strings), over this process's environment (with
    `inherit_txl=False`, over it without its TXL_* variables). Start it (`start()`, or `with`), and stop it
    (`stop()`, `terminate()`, `kill()`); it may start again after."""

    client_timeout = 60

    def __init__(
        self, log_path: Path, *, port: int | None = None, inherit_txl: bool = True, **env: str
    ) -> None:
        self.port = port or free_port()
        self.log_path = Path(log_path)
        inherited = {k: v for k, v in os.environ.items() if inherit_txl or not k.startswith("TXL_")}
        self.env = {
            **inherited,
            # One torch thread: on a small shared machine, intra-op threads spin against each other, and a
            # tiny model's steps slow down many times over.
            "TXL_THREADS": "1",
            "TXL_LOG_LEVEL": "warning",
            "TXL_PORT": str(self.port),
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self._log_from = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 90) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "txl_server"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        try:
            wait_until_started(self._ready, self._exited, timeout=timeout, interval=0.1)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}:\n{self.log()}") from None
        return self

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/ready", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def _exited(self) -> str | None:
        assert self.process is not None
        return None if self.process.poll() is None else "the server exited at start"

    def log(self) -> str:
        """What this run (since the last start) wrote."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_from)
            return log.read().decode(errors="replace")

    def rss_bytes(self) -> int:
        """The process's resident set size (VmRSS)."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None
        return int(match.group(1)) * 1024

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM (a graceful shutdown); its exit status."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL, if it runs: no shutdown hooks run, nothing is flushed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """Stops it if it runs: SIGTERM, then SIGKILL if it has not ended in 30 seconds."""
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


def standalone(model_dir: Path, log_path: Path, **env: str) -> ServerProcess:
    """A server on `model_dir` as an operator starts one on a host: its own embedded Redis, none of this
    process's TXL_* variables, and its log at the info level (what it says about its sessions)."""
    return ServerProcess(log_path, inherit_txl=False, TXL_MODEL=str(model_dir), TXL_LOG_LEVEL="info", **env)


def kill_mid_stream(
    server: ServerProcess, client: httpx.Client, session_id: str, *, after_lines: int
) -> None:
    """Starts a long streamed generation on the session and SIGKILLs `server` once `after_lines` lines of the
    stream came: a step that never commits."""
    body = {"max_tokens": 4000, "stream": True}
    with client.stream("POST", f"/v1/sessions/{session_id}/generate", json=body) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i == after_lines:
                server.kill()
                break
