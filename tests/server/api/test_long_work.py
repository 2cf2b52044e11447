"""Long work streamed (docs/api.md, "Long work"): append, create with text, import and score answer with progress
events and then the result their JSON answer would hold; errors before the work begins stay plain HTTP errors;
a slow step that reports progress outlives a client timeout shorter than the whole step."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.helpers.gate import Gate
from tests.helpers.live_server import client_fixture, live_server_fixture
from tests.helpers.sse import sse_events

KEY = "key-long-work"
TEXT = (
    "It was the best of times, it was the worst of times. " * 4
)  # 212 tokens: 27 segments of the tiny model


server = live_server_fixture("long", api_keys=KEY)
client = client_fixture(KEY)


def streamed(client: httpx.Client, path: str, **kwargs) -> tuple[int, list]:
    with client.stream("POST", path, **kwargs) as response:
        assert response.headers["content-type"].startswith("text/event-stream"), response.read()
        return response.status_code, sse_events(response)


def check_progress(events: list, total: int) -> dict:
    """The events are progress from 0 to `total`, in order, then the result and [DONE]: returns the result."""
    assert events[-1] == "[DONE]" and events[-2]["type"] == "result", events[-3:]
    progress = [(e["tokens_done"], e["tokens_total"]) for e in events[:-2]]
    assert all(e["type"] == "progress" for e in events[:-2])
    assert progress[0] == (0, total) and progress[-1] == (total, total), progress
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    return {k: v for k, v in events[-2].items() if k != "type"}


def test_a_streamed_append_reports_progress_then_what_the_json_answer_holds(client):
    base = client.post("/v1/sessions", json={"text": "Chapter 1."}).json()
    one = client.post(f"/v1/sessions/{base['id']}/fork").json()
    two = client.post(f"/v1/sessions/{base['id']}/fork").json()
    as_json = client.post(f"/v1/sessions/{one['id']}/append", json={"text": TEXT}).json()
    status, events = streamed(client, f"/v1/sessions/{two['id']}/append", json={"text": TEXT, "stream": True})
    result = check_progress(events, len(TEXT))
    assert status == 200 and result["tokens"] == as_json["tokens"] == len(TEXT)
    assert result["logprob"] == pytest.approx(as_json["logprob"], rel=1e-5)
    assert result["session"]["version"] == 2 and result["session"]["tokens"] == 10 + len(TEXT)
    assert client.get(f"/v1/sessions/{two['id']}").json() == result["session"]


def test_a_streamed_create_with_text_answers_201_with_progress(client):
    status, events = streamed(
        client, "/v1/sessions", json={"text": TEXT, "stream": True, "metadata": {"a": 1}}
    )
    session = check_progress(events, len(TEXT))
    assert status == 201 and session["tokens"] == len(TEXT) and session["metadata"] == {"a": 1}
    assert client.get(f"/v1/sessions/{session['id']}").json() == session


def test_a_streamed_import_answers_201_and_a_keyed_retry_makes_no_second_session(client):
    exported = client.get(
        f"/v1/sessions/{client.post('/v1/sessions', json={'text': TEXT}).json()['id']}/snapshot"
    )
    headers = {"Content-Type": "application/octet-stream", "Idempotency-Key": "import-once"}
    before = len(client.get("/v1/sessions").json()["data"])
    status, events = streamed(
        client, "/v1/sessions/import", params={"stream": "true"}, content=exported.content, headers=headers
    )
    assert status == 201 and events[-2]["type"] == "result" and events[-1] == "[DONE]"
    session = {k: v for k, v in events[-2].items() if k != "type"}
    assert session["tokens"] == len(TEXT)
    again = client.post("/v1/sessions/import", content=exported.content, headers=headers)  # as JSON this time
    assert again.status_code == 201 and again.json() == session
    assert len(client.get("/v1/sessions").json()["data"]) == before + 1


def test_a_streamed_retry_replays_the_first_answer(client):
    session = client.post("/v1/sessions", json={"text": "once"}).json()
    path, headers = f"/v1/sessions/{session['id']}/append", {"Idempotency-Key": "append-once"}
    first = client.post(path, json={"text": " more"}, headers=headers).json()
    status, events = streamed(client, path, json={"text": " more", "stream": True}, headers=headers)
    assert status == 200 and events == [{"type": "result", **first}, "[DONE]"]
    assert client.get(f"/v1/sessions/{session['id']}").json()["version"] == 2


def test_errors_before_the_work_begins_are_plain_http_errors(client):
    unknown = client.post("/v1/sessions/nope/append", json={"text": "x", "stream": True})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found"
    too_long = client.post("/v1/sessions", json={"text": "x", "mem_len": 10**6, "stream": True})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "mem_len"
    garbage = client.post(
        "/v1/sessions/import", params={"stream": "true"}, content=b"nope", headers={"Content-Type": "x/y"}
    )
    assert garbage.status_code == 400 and garbage.json()["error"]["param"] == "body"


def test_a_slow_step_that_reports_progress_outlives_a_shorter_client_timeout(server, client):
    """Each forward of the engine is slowed down so that the append takes ~7 s, against a client that waits at
    most 2.5 s for the next bytes: streamed, progress arrives every ~0.25 s and the append succeeds; as JSON (which
    says nothing until the end) the same client times out.

    The margins hold on a busy machine: the client's timeout is ten times the pace of progress (a forward of the
    tiny model, slowed by 0.25 s, once took over a second on a loaded machine, and a 1 s timeout then expired
    between two events), and the whole step still lasts well over twice the timeout."""
    runner = server.app.state.runtime.service.worker.runner  # each call: one forward (a segment of 8 tokens)
    session = client.post("/v1/sessions", json={"text": "slow"}).json()
    path = f"/v1/sessions/{session['id']}/append"
    timeout = 2.5
    impatient = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=timeout)
    with impatient, Gate(runner, "run", delay=0.25):  # 27 forwards: at least 6.75 s
        started = time.monotonic()
        status, events = streamed(impatient, path, json={"text": TEXT, "stream": True})
        assert time.monotonic() - started > 2 * timeout  # much longer than the client's timeout
        assert status == 200 and check_progress(events, len(TEXT))["session"]["version"] == 2
        with pytest.raises(httpx.ReadTimeout):
            impatient.post(path, json={"text": TEXT})


def test_a_client_that_leaves_a_streamed_append_commits_nothing(server, client):
    session = client.post("/v1/sessions", json={"text": "left"}).json()
    body = json.dumps({"text": TEXT, "stream": True}).encode()
    runner = server.app.state.runtime.service.worker.runner
    worker = server.app.state.runtime.service.worker
    with Gate(runner, "run", delay=0.05), socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.sendall(
            (
                f"POST /v1/sessions/{session['id']}/append HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        received = b""
        while b'"tokens_done"' not in received:  # the step is under way
            received += raw.recv(4096)
    deadline = time.monotonic() + 10
    while worker.active_jobs and time.monotonic() < deadline:
        time.sleep(0.02)
    assert worker.active_jobs == 0
    assert client.get(f"/v1/sessions/{session['id']}").json()["version"] == 1
    assert (
        client.post(f"/v1/sessions/{session['id']}/append", json={"text": "!"}).json()["session"]["version"]
        == 2
    )
