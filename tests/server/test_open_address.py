"""Listening where other machines can reach the server, without API keys, is said at start-up as a warning (the
Docker image listens on 0.0.0.0 by default): anyone who reaches the address could use every session."""

from __future__ import annotations

import logging

import pytest
from txl_server import runtime
from txl_server.__main__ import main
from txl_server.serving import beyond_loopback, bind_sockets
from txl_server.sessions import redis_server

WARNING = "without API keys: anyone who can reach it"


@pytest.mark.parametrize(
    ("host", "keys", "warned"),
    [
        ("0.0.0.0", None, True),
        ("0.0.0.0", "a-key", False),
        ("127.0.0.1", None, False),
        ("localhost", None, False),
    ],
)
def test_start_up_warns_when_other_machines_may_use_it_without_a_key(
    host, keys, warned, tmp_path, monkeypatch, caplog
):
    # The model cannot load: start-up stops there, after binding and the checks that stop it in one line.
    def unloadable(settings):
        raise OSError("no model here")

    monkeypatch.setattr(runtime, "load_model", unloadable)
    monkeypatch.setenv("TXL_REDIS_DATA_DIR", str(tmp_path / "sessions"))
    if keys is not None:
        monkeypatch.setenv("TXL_API_KEYS", keys)
    with caplog.at_level(logging.WARNING, logger="txl_server"):
        assert main(["--host", host, "--port", str(redis_server.free_port())]) == 2
    warnings = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(warnings) == (1 if warned else 0), warnings
    if warned:
        assert warnings[0].startswith("listening on 0.0.0.0:") and "TXL_API_KEYS" in warnings[0]


def test_only_addresses_beyond_loopback_count():
    sockets = bind_sockets("0.0.0.0", 0) + bind_sockets("127.0.0.1", 0)
    try:
        reachable = beyond_loopback(sockets)
        assert reachable == [f"0.0.0.0:{sockets[0].getsockname()[1]}"]
    finally:
        for sock in sockets:
            sock.close()
