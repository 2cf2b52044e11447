"""`python -m txl_server store migrate|sweep|status`, run as an operator runs it, against a real Redis holding
the blocks an older server kept there."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import redis
from txl_server.sessions.redis_server import free_port

from tests.helpers.server_process import REPO


def _store(action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txl_server", "store", action],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_the_store_command_moves_an_older_servers_blocks_out_of_redis(redis_server, tmp_path):
    prefix = f"cmd-{uuid.uuid4().hex[:8]}:"
    client = redis.Redis(port=redis_server.port)
    for block in ("aa11", "bb22"):  # referenced blocks whose bytes an older server kept in Redis
        client.hset(f"{prefix}k:{block}", mapping={"n": 1, "d": f"bytes of {block}".encode()})
    env = {"TXL_REDIS_URL": redis_server.url, "TXL_REDIS_PREFIX": prefix, "TXL_BLOCK_STORE": str(tmp_path)}
    status = _store("status", env)
    assert status.returncode == 0 and "(an older server's): 2" in status.stdout, status.stderr
    moved = _store("migrate", env)
    assert moved.returncode == 0 and "moved 2 blocks" in moved.stdout, moved.stderr
    assert not client.hexists(f"{prefix}k:aa11", "d") and client.hget(f"{prefix}k:aa11", "n") == b"1"
    stored = sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and p.name != "store.json")
    assert stored == ["aa11", "bb22"]
    after = _store("status", env)
    assert "blocks: 2" in after.stdout and "(an older server's): 0" in after.stdout
    swept = _store("sweep", env)
    assert swept.returncode == 0 and "collected 0" in swept.stdout  # referenced, and young


def test_a_replica_given_an_empty_block_store_refuses_to_start_in_one_line(
    redis_server, tmp_path, tiny_model_dir
):
    prefix = f"cmd-{uuid.uuid4().hex[:8]}:"
    env = {
        "TXL_REDIS_URL": redis_server.url,
        "TXL_REDIS_PREFIX": prefix,
        "TXL_BLOCK_STORE": str(tmp_path / "shared"),
        "TXL_MODEL": str(tiny_model_dir),
    }
    assert _store("status", env).returncode == 0  # the first replica's store: marked as Redis's
    wrong = {**env, "TXL_BLOCK_STORE": str(tmp_path / "a-local-disk")}
    started = subprocess.run(
        [sys.executable, "-m", "txl_server", "--port", str(free_port())],
        env={**os.environ, **wrong},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert started.returncode == 2, started.stderr
    lines = [line for line in started.stderr.splitlines() if "block store" in line]
    assert (
        len(lines) == 1
        and "holds nothing of this session store" in lines[0]
        and "TXL_BLOCK_STORE" in lines[0]
    )
