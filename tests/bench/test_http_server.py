"""`bench/http.py`'s `Server`, the real server process the HTTP benchmarks (and `bench gpu`'s) measure: one that
exits before it is ready is noticed at once, and its last lines are raised with it (review round 3, finding 5:
it polled /ready for its whole 120 s deadline on a child that had died at once, two minutes of a GPU window)."""

from __future__ import annotations

import time

import pytest

from bench import http


def test_a_server_that_exits_at_once_is_reported_at_once_with_what_it_said(tmp_path):
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        http.Server(tmp_path / "no-model-here", env={"TXL_DEVICE": "cpu"})
    assert time.monotonic() - started < 30  # its start-up deadline is 120 s
    message = str(raised.value)
    assert message.startswith("the server exited with status 2 before it was ready:")
    assert f"  | model directory not found: {tmp_path / 'no-model-here'}" in message.splitlines()


def test_a_server_that_never_gets_ready_is_stopped_at_its_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(http.Server, "STARTUP_SECONDS", 0)
    with pytest.raises(RuntimeError, match="the server was not ready after 0 s"):
        server = http.Server(tmp_path / "no-model-here", env={"TXL_DEVICE": "cpu"})
        server.stop()
