"""The server exactly as the README starts it: `bash scripts/serve.sh`, the bundled model, no API key, no TXL_*
setting, in a process of its own.

Two things differ from a reader's machine, neither of them the server's configuration: the port (8000 may be
taken where tests run; `--port`, which the README names, chooses another), and where sessions are kept (the
user's data directory, `XDG_DATA_HOME`: a temporary one, not the tester's own). The environment is a fresh
shell's (tests/helpers/fresh_shell.py), so nothing the test run sets (TXL_THREADS, ...) reaches the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
from txl_server.sessions.redis_server import free_port

from tests.helpers.fresh_shell import MINIMAL_PATH
from tests.helpers.servers import LoopbackServer, wait_until_started

REPO = Path(__file__).resolve().parents[2]


class ReadmeServer(LoopbackServer):
    client_timeout = 60

    def __init__(self, data_dir: Path, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.env = {
            "HOME": os.environ.get(
                "HOME", str(data_dir)
            ),  # the compiled kernels' cache is the user's, as it is
            "PATH": MINIMAL_PATH,
            "LANG": "C.UTF-8",
            "XDG_DATA_HOME": str(data_dir),
        }
        if os.environ.get("PYTHONPATH"):  # a worktree tested against another checkout's environment
            self.env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 300) -> ReadmeServer:
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                ["bash", "scripts/serve.sh", "--port", str(self.port)],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: serve.sh execs the server, which starts Redis
            )
        wait_until_started(self._ready, self._failed, timeout=timeout, interval=0.5)
        return self

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/ready", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def _failed(self) -> str | None:
        assert self.process is not None
        if self.process.poll() is None:
            return None
        return f"serve.sh exited ({self.process.returncode}): {self.log_path.read_text()[-2000:]}"

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGINT)  # Ctrl-C, as a reader stops it
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def __enter__(self) -> ReadmeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
