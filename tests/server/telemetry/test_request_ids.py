"""Every answer carries an X-Request-Id, tracing or not: JSON answers, errors of every layer (an unknown route, a
missing key, a body over the limit, an invalid body, a missing session), streams of tokens and of long work. A
caller's sane id is kept; anything else is replaced by a new one rather than refused."""

from __future__ import annotations

import re

import pytest

from tests.helpers.live_server import client_fixture, live_server_fixture

KEY = "key-request-ids"
NEW_ID = re.compile(r"[0-9a-f]{32}")

server = live_server_fixture("request-ids", api_keys=KEY, max_body_bytes=4096)
client = client_fixture(KEY)


@pytest.fixture
def session(client):
    return client.post("/v1/sessions", json={"text": "Once upon a time"}).json()


def test_json_answers_and_errors_of_every_layer_carry_a_new_request_id(server, client, session):
    answers = [
        client.get("/health"),
        client.get("/v1/models"),
        client.get(f"/v1/sessions/{session['id']}"),
        client.get("/v1/nothing-here"),  # no route
        server.client().get("/v1/sessions"),  # no key
        client.post("/v1/sessions", content=b"x" * 8192, headers={"content-type": "application/json"}),
        client.post("/v1/sessions", content=b"{not json", headers={"content-type": "application/json"}),
        client.get("/v1/sessions/no-such-session"),
        client.post("/v1/completions", json={"prompt": "a", "max_tokens": -1}),  # OpenAI's error shape
    ]
    statuses = [a.status_code for a in answers]
    assert statuses[:3] == [200, 200, 200] and statuses[3] == 404 and statuses[4] == 401
    assert statuses[5] == 413 and statuses[6] in (400, 422) and statuses[7] == 404 and statuses[8] >= 400
    ids = [a.headers.get("x-request-id") for a in answers]
    assert all(i is not None and NEW_ID.fullmatch(i) for i in ids), ids
    assert len(set(ids)) == len(ids)  # one per request


def test_a_token_stream_and_a_long_work_stream_carry_the_callers_request_id(client, session):
    body = {"text": " there was", "max_tokens": 4, "stream": True}
    headers = {"X-Request-Id": "client-7c1d:stream/1"}
    with client.stream("POST", f"/v1/sessions/{session['id']}/generate", json=body, headers=headers) as r:
        assert r.status_code == 200 and r.headers["x-request-id"] == "client-7c1d:stream/1"
        assert r.read().endswith(b"data: [DONE]\n\n")
    headers = {"X-Request-Id": "01J9ZK3W8Q5N6R7T8V9X0Y1Z2A"}
    with client.stream(
        "POST", "/v1/score", json={"text": "a long document", "stream": True}, headers=headers
    ) as r:
        assert r.status_code == 200 and r.headers["x-request-id"] == headers["X-Request-Id"]
        r.read()


@pytest.mark.parametrize("given", ["x" * 129, "has space", "tab\tin", "ünïcode", ""])
def test_a_request_id_that_is_not_sane_is_replaced_not_refused(client, given):
    answer = client.get("/v1/models", headers={"X-Request-Id": given.encode("utf-8")})
    assert answer.status_code == 200
    assert NEW_ID.fullmatch(answer.headers["x-request-id"])


def test_a_request_id_of_128_visible_characters_is_kept(client):
    given = "A-z0~!#$%&'*+.^_`|" + "9" * 110
    assert len(given) == 128
    assert client.get("/v1/models", headers={"X-Request-Id": given}).headers["x-request-id"] == given


def test_the_last_resort_500_from_outside_every_layer_carries_the_request_id(server, client, monkeypatch):
    """An error in a layer around the app's own error handling (here: the shutdown gate failing) is answered by
    Starlette from outside every layer, ours included: that answer names its request id itself."""

    async def broken(*args):
        raise RuntimeError("the gate broke")

    monkeypatch.setattr(server.app.state.shutdown, "run", broken)
    answer = client.get("/v1/models", headers={"X-Request-Id": "outer-500"})
    assert answer.status_code == 500 and answer.headers["x-request-id"] == "outer-500"
    assert answer.json()["error"]["type"] == "server_error"  # /v1/models: OpenAI's shape
