"""Clients that leave before a non-streamed answer (docs/server.md, "a client that went away"): the work stops,
nothing is committed or registered, the cancellation is counted, and the session is free again at once.

A real server; a raw socket that sends one request and closes while the work runs; and a gate that holds the work
inside the engine's forward pass (or the snapshot loader, for import) until the client has gone, so that nothing
depends on the machine's speed.
"""

from __future__ import annotations

import json
import socket
import time
import uuid

import pytest
from txl_server.engine.state import ModelState

from tests.helpers.gate import Gate
from tests.helpers.live_server import client_fixture, live_server_fixture

KEY = "key-disconnect"
TEXT = "It was the best of times, it was the worst of times. " * 20  # ~135 segments of the tiny model


server = live_server_fixture("gone", api_keys=KEY)
client = client_fixture(KEY)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_until(predicate, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def send_and_leave(server, gate: Gate, path: str, body: bytes, headers: dict[str, str] | None = None) -> None:
    """Sends `POST path` on a raw connection, waits until the work is inside the gate, then closes the connection
    without reading an answer (what `curl -m 3` does when its time runs out)."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{server.port}",
        f"Authorization: Bearer {KEY}",
        "Content-Type: " + ("application/octet-stream" if path.endswith("/import") else "application/json"),
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        assert gate.entered.wait(20), "the request never reached the gate"
    finally:
        connection.close()


def left(client, route: str, before: str) -> None:
    """Waits until the server has seen the client leave: the request ended with 499 (client closed request)."""
    name = f'txl_requests_total{{method="POST",route="{route}",status="499"}}'
    assert wait_until(lambda: metric(client.get("/metrics").text, name) == metric(before, name) + 1), (
        f"{route}: the request did not end when its client left"
    )


def abandon(server, client, route: str, path: str, body: dict, headers: dict | None = None) -> None:
    """One request whose client leaves while the worker computes it; returns once the worker is idle again and
    checks that the job was cancelled (counted), not finished."""
    runner = server.app.state.runtime.service.worker.runner  # each call: one forward of the engine
    before = client.get("/metrics").text
    with Gate(runner, "run") as gate:
        send_and_leave(server, gate, path, json.dumps(body).encode(), headers)
        left(client, route, before)
    worker = server.app.state.runtime.service.worker
    cancelled = metric(before, "txl_cancellations_total") + 1
    assert wait_until(lambda: metric(client.get("/metrics").text, "txl_cancellations_total") >= cancelled)
    assert wait_until(lambda: worker.active_jobs == 0)


def sessions_of(client) -> set[str]:
    return {s["id"] for s in client.get("/v1/sessions").json()["data"]}


def test_an_abandoned_create_registers_no_session(server, client):
    before = sessions_of(client)
    abandon(server, client, "/v1/sessions", "/v1/sessions", {"text": TEXT})
    time.sleep(0.2)  # had the work gone on, its session would be registered by now
    assert sessions_of(client) == before  # no orphan that nobody received the id of


def test_an_abandoned_append_commits_nothing_and_frees_the_session_and_its_key(server, client):
    session = client.post("/v1/sessions", json={"text": "Chapter 1."}).json()
    path = f"/v1/sessions/{session['id']}/append"
    key = {"Idempotency-Key": "gone-" + uuid.uuid4().hex}
    abandon(server, client, "/v1/sessions/{session_id}/append", path, {"text": TEXT}, key)
    after = client.get(f"/v1/sessions/{session['id']}").json()
    assert (after["version"], after["tokens"]) == (session["version"], session["tokens"])
    # At once: the lease is released (no 409) and the key too (the retry runs, it is not told "in progress").
    retried = client.post(path, json={"text": TEXT}, headers=key)
    assert retried.status_code == 200, retried.text
    assert retried.json()["session"]["version"] == session["version"] + 1
    assert client.delete(f"/v1/sessions/{session['id']}").status_code == 204


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream-before-its-first-token"])
def test_an_abandoned_generation_commits_nothing(server, client, stream):
    session = client.post("/v1/sessions", json={"text": "Once"}).json()
    # The stream's client leaves while the prompt is ingested, before the response (and its own watch) began.
    body = {"text": TEXT, "max_tokens": 50, "stream": True} if stream else {"max_tokens": 200}
    path = f"/v1/sessions/{session['id']}/generate"
    abandon(server, client, "/v1/sessions/{session_id}/generate", path, body)
    after = client.get(f"/v1/sessions/{session['id']}").json()
    assert (after["version"], after["tokens"]) == (session["version"], session["tokens"])
    assert client.post(path, json={"max_tokens": 2}).status_code == 200


def test_an_abandoned_score_stops(server, client):
    abandon(server, client, "/v1/score", "/v1/score", {"text": TEXT})


def test_abandoned_completions_stop_and_commit_nothing(server, client):
    abandon(server, client, "/v1/completions", "/v1/completions", {"prompt": TEXT, "max_tokens": 5})
    session = client.post("/v1/sessions", json={"text": "Once"}).json()
    body = {"prompt": " upon", "max_tokens": 200, "session_id": session["id"]}
    abandon(server, client, "/v1/completions", "/v1/completions", body)
    after = client.get(f"/v1/sessions/{session['id']}").json()
    assert (after["version"], after["tokens"]) == (session["version"], session["tokens"])


def test_an_abandoned_import_registers_no_session(server, client):
    session = client.post("/v1/sessions", json={"text": "export me"}).json()
    snapshot = client.get(f"/v1/sessions/{session['id']}/snapshot").content
    before = sessions_of(client)
    metrics_before = client.get("/metrics").text
    with Gate(ModelState, "from_bytes") as gate:
        send_and_leave(server, gate, "/v1/sessions/import", snapshot)
        left(client, "/v1/sessions/import", metrics_before)
    time.sleep(0.2)  # the loader finished after the client left: its session must not appear
    assert sessions_of(client) == before
    imported = client.post(
        "/v1/sessions/import", content=snapshot, headers={"Content-Type": "application/octet-stream"}
    )
    assert imported.status_code == 201 and sessions_of(client) == before | {imported.json()["id"]}


async def test_a_commit_under_way_finishes_when_its_request_is_cancelled():
    """A commit is one step in Redis and in the cache together: once begun, a cancellation does not cut it."""
    import asyncio

    from txl_server.sessions.step import to_the_end

    began, release, steps = asyncio.Event(), asyncio.Event(), []

    async def commit() -> str:
        began.set()
        await release.wait()  # e.g. between the Redis commit and the cache update
        steps.append("placed")
        return "committed"

    request = asyncio.create_task(to_the_end(commit()))
    await began.wait()
    request.cancel()  # the client left
    await asyncio.sleep(0.01)
    release.set()
    assert await request == "committed" and steps == ["placed"]
