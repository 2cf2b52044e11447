"""A stateful server keeps its state: a real server process, with its private Redis in the default persistent
data directory, restarted gracefully (SIGTERM) and after `kill -9`, in every persistence mode. Whatever the mode,
every session it lists can take a step, and every session it no longer lists answers 410 saying what happened.

Small memory budgets put some sessions in each tier (device, host, Redis or dropped) before each restart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from txl_server.sessions.redis_server import lock_data_dir

from tests.helpers.server_process import standalone

pytestmark = pytest.mark.timeout(400)

BUDGETS = {"TXL_DEVICE_MEMORY_BYTES": "60000", "TXL_HOST_MEMORY_BYTES": "60000"}  # ~2 sessions each
GREEDY = {"max_tokens": 12, "temperature": 0}


def create(client, text: str) -> str:
    response = client.post("/v1/sessions", json={"text": text})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def listed(client) -> set[str]:
    return {s["id"] for s in client.get("/v1/sessions").json()["data"]}


def check_sessions(client, made: set[str]) -> tuple[set[str], dict[str, str]]:
    """Every listed session takes a step; every other one made is 410 `gone`. Returns the listed ids and, for the
    others, their 410 messages."""
    shown = listed(client)
    for session_id in shown:
        step = client.post(f"/v1/sessions/{session_id}/append", json={"text": " and on"})
        assert step.status_code == 200, (session_id, step.text)
    messages = {}
    for session_id in made - shown:
        response = client.get(f"/v1/sessions/{session_id}")
        assert response.status_code == 410, (session_id, response.text)
        error = response.json()["error"]
        assert error["type"] == "gone" and error["param"] == "session_id"
        messages[session_id] = error["message"]
        step = client.post(f"/v1/sessions/{session_id}/append", json={"text": "x"})
        assert step.status_code == 410 and step.json()["error"]["message"] == error["message"]
    return shown, messages


@pytest.mark.parametrize("mode", ["always", "evict", "none"])
def test_every_listed_session_steps_after_a_graceful_restart_and_a_kill(mode, tiny_model_dir, tmp_path):
    data_home = tmp_path / "data"
    kept_in = data_home / "txl-serve" / "redis" / "tiny-byte"
    server = standalone(
        tiny_model_dir, tmp_path / "server.log", XDG_DATA_HOME=str(data_home), TXL_PERSISTENCE=mode, **BUDGETS
    )
    try:
        server.start()
        assert f"sessions are kept in {kept_in} (persistence {mode})" in server.log()
        with server.client() as client:
            made = {create(client, f"Session number {i} begins here.") for i in range(6)}
            last = create(client, "The most recent session, on the device.")
            made.add(last)
            fork = client.post(f"/v1/sessions/{last}/fork").json()["id"]  # same memory: its continuation is
            expected = client.post(f"/v1/sessions/{fork}/generate", json=GREEDY).json()[
                "text"
            ]  # the original's
            client.delete(f"/v1/sessions/{fork}")

        # ---- a graceful restart
        assert server.terminate() == 0
        log = server.log()
        assert f"stopped; sessions are kept in {kept_in}" in log and "Traceback" not in log, log
        server.start()
        with server.client() as client:
            if mode != "none":  # the continuation is exactly the one it would have been without a restart
                assert client.post(f"/v1/sessions/{last}/generate", json=GREEDY).json()["text"] == expected
            shown, gone = check_sessions(client, made)
            if mode == "none":
                assert not shown and set(gone) == made
                assert all("persistence 'none'" in message for message in gone.values()), gone
            else:
                assert shown == made and not gone
            fresh = {create(client, f"Made after the restart, {i}.") for i in range(3)}
            made |= fresh

        # ---- kill -9: what only the process held is lost, and said to be
        server.kill()
        server.start()
        with server.client() as client:
            shown, gone = check_sessions(client, made)
            crashed = {i for i, message in gone.items() if "stopped without saving it" in message}
            if mode == "always":
                assert shown == made and not gone
            elif mode == "evict":  # those evicted to Redis survive; those in process memory are lost
                assert shown and fresh <= crashed and set(gone) == crashed, (shown, gone)
            else:
                assert not shown and fresh <= crashed
        assert server.terminate() == 0
    finally:
        server.kill()
    lock_data_dir(kept_in, wait_seconds=5).close()  # no redis-server left behind, even after the kill


def test_ephemeral_sessions_are_throw_away_and_say_so(tiny_model_dir, tmp_path):
    data_home = tmp_path / "data"
    server = standalone(
        tiny_model_dir, tmp_path / "server.log", XDG_DATA_HOME=str(data_home), TXL_EPHEMERAL="1"
    )
    try:
        server.start()
        said = re.search(
            r"sessions are throw-away \(--ephemeral\): kept in a temporary directory deleted at "
            r"shutdown, (\S+)",
            server.log(),
        )
        assert said is not None, server.log()
        with server.client() as client:
            create(client, "gone with the server")
        assert Path(said.group(1)).is_dir()
        assert server.terminate() == 0
        assert "the throw-away sessions were deleted" in server.log()
    finally:
        server.kill()
    assert not Path(said.group(1)).exists() and not data_home.exists()
