"""A port already in use stops `python -m txl_server` in one line with status 2, before the model loads or
Redis starts (it used to load for seconds, then die with uvicorn's raw `[Errno 98]` and status 3)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from txl_server.__main__ import main
from txl_server.serving import PortUnavailable, bind_sockets
from txl_server.sessions import redis_server

REPO = Path(__file__).resolve().parents[2]


def listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_port_in_use_stops_start_up_in_one_line_before_loading(tmp_path):
    with listening_socket() as taken:
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "txl_server", "--port", str(port)],
            cwd=REPO,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TXL_LOG_LEVEL": "info"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        seconds = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "already in use" in lines[0] and "--port" in lines[0]
    assert "loading the model" not in done.stderr and seconds < 20
    assert not (tmp_path / ".local").exists()  # no Redis was started, no data directory made


def test_bound_sockets_refuse_a_second_binder_and_free_the_port_when_closed():
    sockets = bind_sockets("127.0.0.1", 0)
    port = sockets[0].getsockname()[1]
    try:
        try:
            bind_sockets("127.0.0.1", port)
        except PortUnavailable as exc:
            assert "already in use" in str(exc)
        else:
            raise AssertionError("a bound port was bound twice")
    finally:
        for sock in sockets:
            sock.close()
    for sock in bind_sockets("127.0.0.1", port):
        sock.close()


def test_a_data_directory_in_use_stops_start_up_in_one_line(tmp_path, capsys, monkeypatch):
    """Two servers on one private Redis directory would corrupt it: the second stops before loading."""
    monkeypatch.setattr(redis_server, "LOCK_WAIT_SECONDS", 0.2)
    held = redis_server.lock_data_dir(tmp_path / "sessions")
    try:
        argv = ["--port", str(redis_server.free_port())]
        monkeypatch.setenv("TXL_REDIS_DATA_DIR", str(tmp_path / "sessions"))
        assert main(argv) == 2
    finally:
        held.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "in use by another TXL server" in lines[0] and "--ephemeral" in lines[0], lines
    assert f"pid {os.getpid()}" in lines[0]
