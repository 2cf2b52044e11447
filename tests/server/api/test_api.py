"""The HTTP API against a real uvicorn server on loopback and a real Redis."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid

import httpx
import pytest
from txl_server.api.app import create_app
from txl_server.settings import Persistence, Settings

from tests.helpers.live_server import LiveServer, client_fixture, live_server_fixture, serve
from tests.helpers.sse import sse_events

KEY_A, KEY_B = "key-tenant-a", "key-tenant-b"


server = live_server_fixture(
    "api",
    api_keys=f"{KEY_A},{KEY_B}",
    max_body_bytes=64 * 1024,
    max_text_chars=8 * 1024,
    max_tokens=256,
    max_stop_strings=2,
    max_stop_chars=8,
    max_metadata_bytes=256,
    max_sessions_per_tenant=50,
)
a = client_fixture(KEY_A)
b = client_fixture(KEY_B)


OPENAI_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models")


def error_of(response: httpx.Response) -> dict:
    """The error object, in the server's shape (with a `code` where a finer reason helps); on the OpenAI routes, in
    OpenAI's (always with `code`)."""
    body = response.json()
    shape = {"type", "message", "param"} | ({"code"} if response.url.path in OPENAI_ROUTES else set())
    assert set(body) == {"error"} and shape <= set(body["error"]) <= shape | {"code"}, body
    return body["error"]


def kind_of(response: httpx.Response) -> str:
    """What went wrong: the error's type, or on the OpenAI routes its code (the type is OpenAI's category)."""
    error = error_of(response)
    return error["code"] if "code" in error else error["type"]


def create(client, **body) -> dict:
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()


# ---------------------------------------------------------------------------------------------- sessions


def test_session_lifecycle(a):
    session = create(a, text="Hello", metadata={"user": "ada"}, ttl_seconds=600)
    assert session["object"] == "session" and len(session["id"]) >= 22  # >= 128 random bits, url-safe
    assert (session["tokens"], session["version"], session["metadata"]) == (5, 1, {"user": "ada"})
    assert session["expires_at"] - session["created_at"] in (600, 601)
    assert a.get(f"/v1/sessions/{session['id']}").json() == session
    listed = a.get("/v1/sessions").json()
    assert listed["object"] == "list" and session["id"] in [s["id"] for s in listed["data"]]

    appended = a.post(f"/v1/sessions/{session['id']}/append", json={"text": " world"}).json()
    assert appended["tokens"] == 6 and appended["logprob"] < 0
    assert appended["session"]["version"] == 2 and appended["session"]["tokens"] == 11

    fork = a.post(f"/v1/sessions/{session['id']}/fork", json={"metadata": {"branch": 1}})
    assert fork.status_code == 201
    forked = fork.json()
    assert forked["id"] != session["id"] and forked["tokens"] == 11 and forked["metadata"] == {"branch": 1}

    assert a.delete(f"/v1/sessions/{session['id']}").status_code == 204
    assert error_of(a.get(f"/v1/sessions/{session['id']}"))["type"] == "not_found"
    assert a.get(f"/v1/sessions/{forked['id']}").status_code == 200  # the fork lives on


def test_generate_json_and_stream_agree_at_temperature_zero_and_with_a_seed(a):
    base = create(a, text="The whale")
    for params in ({"temperature": 0}, {"temperature": 0.9, "top_k": 40, "top_p": 0.9, "seed": 1234}):
        one = a.post(f"/v1/sessions/{base['id']}/fork").json()
        two = a.post(f"/v1/sessions/{base['id']}/fork").json()
        plain = a.post(f"/v1/sessions/{one['id']}/generate", json={"text": " is", "max_tokens": 24, **params})
        assert plain.status_code == 200, plain.text
        result = plain.json()
        assert result["finish_reason"] == "length" and result["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 24,
        }
        with a.stream(
            "POST",
            f"/v1/sessions/{two['id']}/generate",
            json={"text": " is", "max_tokens": 24, "stream": True, **params},
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = sse_events(response)
        assert events[-1] == "[DONE]"
        tokens = [e for e in events[:-1] if e["type"] == "token"]
        done = events[-2]
        assert len(tokens) == 24 and done["type"] == "done"
        assert "".join(t["token"]["text"] for t in tokens) == done["text"] == result["text"]
        assert done["session"]["version"] == result["session"]["version"] == 2
        assert all(t["token"]["logprob"] <= 0 for t in tokens)


def test_a_long_text_streams_its_progress_before_the_first_token(a):
    base = create(a, text="Call me")
    text = (
        " Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse. " * 3
    )
    body = {"text": text, "max_tokens": 12, "temperature": 0}
    one, two = (a.post(f"/v1/sessions/{base['id']}/fork").json() for _ in range(2))
    plain = a.post(f"/v1/sessions/{one['id']}/generate", json=body).json()
    with a.stream("POST", f"/v1/sessions/{two['id']}/generate", json={**body, "stream": True}) as response:
        events = sse_events(response)[:-1]
    kinds = [e["type"] for e in events]
    progress = [e for e in events if e["type"] == "progress"]
    assert progress and kinds[: len(progress)] == ["progress"] * len(progress)  # all before the first token
    assert progress[-1]["tokens_done"] == progress[-1]["tokens_total"] == len(text)
    assert all(p["tokens_done"] < len(text) for p in progress[:-1])
    done = events[-1]
    assert done["type"] == "done" and done["text"] == plain["text"]  # the same generation either way
    assert done["usage"] == plain["usage"] == {"prompt_tokens": len(text), "completion_tokens": 12}
    assert done["session"]["tokens"] == plain["session"]["tokens"]


def test_stop_strings_end_generation(a):
    session = create(a, text="aaaa")
    first = a.post(f"/v1/sessions/{session['id']}/fork").json()
    text = a.post(f"/v1/sessions/{first['id']}/generate", json={"max_tokens": 30, "temperature": 0}).json()[
        "text"
    ]
    stop = text[3:5]
    result = a.post(
        f"/v1/sessions/{session['id']}/generate", json={"max_tokens": 30, "temperature": 0, "stop": [stop]}
    ).json()
    assert result["finish_reason"] == "stop" and result["text"] == text[: text.find(stop)]


def test_client_disconnect_mid_stream_leaves_the_session_unchanged(server, a):
    session = create(a, text="It was a dark and stormy night")
    with a.stream(
        "POST",
        f"/v1/sessions/{session['id']}/generate",
        json={"max_tokens": 250, "stream": True, "temperature": 0},
    ) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i >= 6:
                break  # leave after a few tokens
    service = server.app.state.runtime.service
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and service.worker.active_jobs:
        time.sleep(0.05)
    assert service.worker.active_jobs == 0  # the generation stopped and left the worker
    after = a.get(f"/v1/sessions/{session['id']}").json()
    assert (after["version"], after["tokens"], after["mem_tokens"]) == (
        session["version"], session["tokens"], session["mem_tokens"]
    )  # fmt: skip
    # and the session is usable right away (its lease was released)
    assert a.post(f"/v1/sessions/{session['id']}/append", json={"text": "."}).status_code == 200


# ---------------------------------------------------------------------------------------------- scoring


def test_score_json_plain_text_and_streamed_progress_agree(a):
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 6
    as_json = a.post("/v1/score", json={"text": text, "token_logprobs": True}).json()
    assert as_json["tokens"] == as_json["bytes"] == len(text)
    assert as_json["bits_per_byte"] == pytest.approx(-as_json["logprob"] / 0.6931471805599453 / len(text))
    assert len(as_json["token_logprobs"]) == len(as_json["token_texts"]) == len(text)
    assert "".join(as_json["token_texts"]) == text
    as_plain = a.post("/v1/score", content=text.encode(), headers={"Content-Type": "text/plain"}).json()
    assert as_plain["logprob"] == pytest.approx(as_json["logprob"], rel=1e-6)
    with a.stream("POST", "/v1/score", json={"text": text, "stream": True}) as response:
        events = sse_events(response)
    assert events[-1] == "[DONE]" and events[-2]["type"] == "result"
    assert events[-2]["logprob"] == pytest.approx(as_json["logprob"], rel=1e-6)
    progress = [e for e in events[:-2] if e["type"] == "progress"]
    assert progress and progress[-1]["tokens_done"] == progress[-1]["tokens_total"] == len(text)


def test_score_rejects_invalid_utf8_and_empty_documents(a):
    bad = a.post("/v1/score", content=b"abc\xff\xfe", headers={"Content-Type": "text/plain"})
    assert bad.status_code == 400 and error_of(bad) == {
        "type": "invalid_request", "message": "the body is not valid UTF-8: byte 3 (0xff)", "param": "body"
    }  # fmt: skip
    # An empty document does not match the schema (minLength 1), as JSON or as text.
    assert a.post("/v1/score", json={"text": ""}).status_code == 422
    empty = a.post("/v1/score", content=b"", headers={"Content-Type": "text/plain"})
    assert empty.status_code == 422 and error_of(empty)["param"] == "text"
    assert a.post("/v1/score", content=b"x", headers={"Content-Type": "application/xml"}).status_code == 400


def test_invalid_utf8_in_a_json_body_names_the_byte_and_the_field(a):
    sid = create(a, text="utf-8")["id"]
    cases = [
        ("/v1/sessions", b'{"text": "abc\xff\xfe"}', 13, "text"),
        (f"/v1/sessions/{sid}/append", b'{"text": "caf\xc3"}', 13, "text"),
        (f"/v1/sessions/{sid}/generate", b'{"max_tokens": 1, "stop": ["ok", "\xe2\x82"]}', 34, "stop.1"),
        ("/v1/sessions", b'{"metadata": {"user": {"na\xffme": 1}}}', 26, "metadata.user"),
        ("/v1/score", b'{"text": "\x80"}', 10, "text"),
        ("/v1/sessions", b'{"text": "\xff', 10, "body"),  # not JSON either: the offset is all there is
    ]
    for path, raw, offset, field in cases:
        response = a.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, (path, response.text)
        error = error_of(response)
        where = "" if field == "body" else f", in {field}"
        assert error == {
            "type": "invalid_request",
            "message": f"the body is not valid UTF-8: byte {offset} (0x{raw[offset]:02x}){where}",
            "param": field,
        }, path
    completion = a.post(
        "/v1/completions", content=b'{"prompt": ["ok", "\xff"]}', headers={"Content-Type": "application/json"}
    )
    assert completion.status_code == 400 and error_of(completion)["param"] == "prompt.1"
    assert a.get(f"/v1/sessions/{sid}").json()["version"] == 1


# ---------------------------------------------------------------------------------------------- errors, limits


def test_authentication_is_required_and_wrong_keys_are_refused(server):
    with server.client() as anonymous:
        response = anonymous.get("/v1/sessions")
        assert response.status_code == 401 and error_of(response)["type"] == "unauthorized"
        assert anonymous.get("/health").status_code == 200  # health stays open for probes
    with server.client("wrong-key") as wrong:
        assert error_of(wrong.post("/v1/sessions", json={}))["type"] == "unauthorized"


def test_tenants_cannot_see_or_touch_each_others_sessions(a, b):
    session = create(a, text="private")
    sid = session["id"]
    for method, path, body in (
        ("GET", f"/v1/sessions/{sid}", None),
        ("DELETE", f"/v1/sessions/{sid}", None),
        ("POST", f"/v1/sessions/{sid}/fork", None),
        ("POST", f"/v1/sessions/{sid}/append", {"text": "x"}),
        ("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 2}),
        ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1, "session_id": sid}),
    ):
        response = b.request(method, path, json=body)
        assert response.status_code == 404 and kind_of(response) == "not_found", (method, path)
    assert sid not in [s["id"] for s in b.get("/v1/sessions").json()["data"]]
    assert a.get(f"/v1/sessions/{sid}").json()["version"] == session["version"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/sessions", {"text": 5}, "text"),
        ("/v1/sessions", {"mem_len": -1}, "mem_len"),
        ("/v1/sessions", {"bogus": 1}, "bogus"),
        ("/v1/sessions", {"mem_len": 10**9}, "mem_len"),
        ("/v1/sessions", {"metadata": {"a": {"b": {"c": {"d": {"e": 1}}}}}}, "metadata"),
        ("/v1/sessions", {"metadata": {"big": "x" * 300}}, "metadata"),
        ("/v1/sessions", {"ttl_seconds": 0}, "ttl_seconds"),
    ],
)
def test_bad_session_input_is_a_clear_error(a, path, body, param):
    response = a.post(path, json=body)
    assert response.status_code in (400, 422)
    error = error_of(response)
    assert error["type"] == "invalid_request" and param in (error["param"] or "")


@pytest.mark.parametrize(
    "body",
    [
        {"max_tokens": 10**6},
        {"max_tokens": -1},
        {"temperature": -0.5},
        {"top_p": 0},
        {"top_p": 1.5},
        {"stop": ["a", "b", "c"]},
        {"stop": ["way too long a stop"]},
        {"stop": [""]},
        {"seed": -1},
        {"unknown": True},
    ],
)
def test_bad_generate_input_is_refused_and_changes_nothing(a, body):
    session = create(a, text="abc")
    response = a.post(f"/v1/sessions/{session['id']}/generate", json=body)
    assert response.status_code in (400, 422) and error_of(response)["type"] == "invalid_request"
    assert a.get(f"/v1/sessions/{session['id']}").json()["version"] == session["version"]


def test_nan_sampling_values_are_refused(a):
    session = create(a, text="abc")
    raw = b'{"temperature": NaN, "max_tokens": 2}'
    response = a.post(
        f"/v1/sessions/{session['id']}/generate", content=raw, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422 and error_of(response)["param"] == "temperature"


def test_oversized_bodies_and_texts_get_413(a):
    session = create(a, text="abc")
    big = a.post(f"/v1/sessions/{session['id']}/append", json={"text": "x" * 70_000})
    assert big.status_code == 413 and error_of(big)["type"] == "payload_too_large"
    long_text = a.post(f"/v1/sessions/{session['id']}/append", json={"text": "x" * 9000})
    assert long_text.status_code == 413

    def chunks():
        for _ in range(80):
            yield b"y" * 1024

    streamed = a.post("/v1/score", content=chunks(), headers={"Content-Type": "text/plain"})
    assert streamed.status_code == 413
    assert a.get(f"/v1/sessions/{session['id']}").json()["version"] == session["version"]


def test_empty_append_and_wrong_content_type_are_refused(a):
    session = create(a, text="abc")
    assert error_of(a.post(f"/v1/sessions/{session['id']}/append", json={"text": ""}))["param"] == "text"
    wrong = a.post(
        f"/v1/sessions/{session['id']}/append",
        content=b"text=hi",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert wrong.status_code == 422 and error_of(wrong)["type"] == "invalid_request"
    assert a.get("/v1/nope").status_code == 404


def test_concurrent_steps_on_one_session_take_turns(a, server):
    """Each waits for the one before it (TXL_LEASE_WAIT_SECONDS); the 409 after a wait: test_lease_wait.py."""
    session = create(a, text="race")
    results = []

    def append():
        with server.client(KEY_A) as client:
            results.append(client.post(f"/v1/sessions/{session['id']}/append", json={"text": "z" * 400}))

    threads = [threading.Thread(target=append) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results)
    assert codes == [200] * 4, [r.text for r in results]
    assert sorted(r.json()["session"]["version"] for r in results) == [
        session["version"] + i for i in (1, 2, 3, 4)
    ]
    after = a.get(f"/v1/sessions/{session['id']}").json()
    assert after["tokens"] == session["tokens"] + 400 * codes.count(200)
    assert after["version"] == session["version"] + codes.count(200)


def test_idempotent_retries_do_not_step_twice(a):
    session = create(a, text="once")
    headers = {"Idempotency-Key": "retry-" + uuid.uuid4().hex}
    first = a.post(f"/v1/sessions/{session['id']}/append", json={"text": " more"}, headers=headers)
    second = a.post(f"/v1/sessions/{session['id']}/append", json={"text": " more"}, headers=headers)
    assert first.json() == second.json()
    assert a.get(f"/v1/sessions/{session['id']}").json()["version"] == session["version"] + 1

    gen_headers = {"Idempotency-Key": "gen-" + uuid.uuid4().hex}
    body = {"max_tokens": 8, "temperature": 0.8, "seed": 5}
    one = a.post(f"/v1/sessions/{session['id']}/generate", json=body, headers=gen_headers).json()
    with a.stream(
        "POST", f"/v1/sessions/{session['id']}/generate", json={**body, "stream": True}, headers=gen_headers
    ) as r:
        replay = sse_events(r)
    assert replay[-2]["text"] == one["text"] == "".join(e["token"]["text"] for e in replay[:-2])
    assert a.get(f"/v1/sessions/{session['id']}").json()["version"] == session["version"] + 2

    fork_headers = {"Idempotency-Key": "fork-" + uuid.uuid4().hex}
    f1 = a.post(f"/v1/sessions/{session['id']}/fork", headers=fork_headers).json()
    f2 = a.post(f"/v1/sessions/{session['id']}/fork", headers=fork_headers).json()
    assert f1["id"] == f2["id"]


def test_an_idempotency_key_reused_with_another_body_is_refused(a):
    session = create(a, text="keys")
    path = f"/v1/sessions/{session['id']}/append"
    headers = {"Idempotency-Key": "reuse-" + uuid.uuid4().hex}
    first = a.post(path, json={"text": " one"}, headers=headers)
    assert first.status_code == 200
    other = a.post(path, json={"text": " two"}, headers=headers)
    assert other.status_code == 422, other.text
    error = error_of(other)
    assert error["type"] == "idempotency_key_reused" and error["param"] == "Idempotency-Key"
    # The same body, written differently (spacing, key order), is the same request: replayed.
    same = a.post(
        path, content=b'{ "text" :  " one" }', headers={**headers, "Content-Type": "application/json"}
    )
    assert same.status_code == 200 and same.json() == first.json()
    assert a.get(f"/v1/sessions/{session['id']}").json()["version"] == session["version"] + 1
    # Another operation with the same key is another request: its own key.
    forked = a.post(f"/v1/sessions/{session['id']}/fork", headers=headers)
    assert forked.status_code == 201


def test_create_and_delete_take_idempotency_keys(a):
    headers = {"Idempotency-Key": "create-" + uuid.uuid4().hex}
    before = len(a.get("/v1/sessions").json()["data"])
    one = a.post("/v1/sessions", json={"text": "only once", "metadata": {"n": 1}}, headers=headers)
    two = a.post("/v1/sessions", json={"metadata": {"n": 1}, "text": "only once"}, headers=headers)
    assert one.status_code == two.status_code == 201 and one.json() == two.json()
    assert len(a.get("/v1/sessions").json()["data"]) == before + 1
    different = a.post("/v1/sessions", json={"text": "another"}, headers=headers)
    assert different.status_code == 422 and error_of(different)["type"] == "idempotency_key_reused"

    sid = one.json()["id"]
    delete_key = {"Idempotency-Key": "delete-" + uuid.uuid4().hex}
    assert a.delete(f"/v1/sessions/{sid}", headers=delete_key).status_code == 204
    assert a.delete(f"/v1/sessions/{sid}", headers=delete_key).status_code == 204  # the retry: replayed
    assert a.delete(f"/v1/sessions/{sid}").status_code == 404  # a new request: the session is gone


# ---------------------------------------------------------------------------------------------- messages


def test_invalid_json_names_the_body_not_an_offset(a):
    response = a.post(
        "/v1/sessions", content=b'{"text": "a" "b"}', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    error = error_of(response)
    assert error["param"] == "body" and error["message"].startswith("the body is not valid JSON")
    assert "at character 13" in error["message"]


def test_a_body_without_content_type_says_to_send_json(a):
    session = create(a, text="abc")
    response = a.post(f"/v1/sessions/{session['id']}/append", content=b'{"text": "x"}')
    assert response.status_code == 422
    error = error_of(response)
    assert error["param"] == "Content-Type"
    assert error["message"] == (
        "send the body as JSON with Content-Type: application/json (this request had no Content-Type)"
    )


def test_create_accepts_no_body_like_fork(a):
    response = a.post("/v1/sessions")
    assert response.status_code == 201, response.text
    assert response.json()["tokens"] == 0 and response.json()["metadata"] == {}


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"temperature": -1}, "temperature should be greater than or equal to 0", "temperature"),
        ({"max_tokens": "many"}, "max_tokens should be a valid integer, unable to parse string as an integer",
         "max_tokens"),
        ({"bogus": 1}, "bogus is not a known field", "bogus"),
        ({"stop": 5}, "stop should be a valid string", "stop"),
    ],
)  # fmt: skip
def test_schema_errors_are_one_sentence_naming_the_field_once(a, body, message, param):
    session = create(a, text="abc")
    error = error_of(a.post(f"/v1/sessions/{session['id']}/generate", json=body))
    assert (error["message"], error["param"]) == (message, param)


def test_a_penalty_is_refused_under_its_own_name(a):
    for penalty in ("presence_penalty", "frequency_penalty"):
        response = a.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, penalty: 0.5})
        assert response.status_code == 400
        error = error_of(response)
        assert error["param"] == penalty and error["message"] == f"{penalty} is not supported (only 0)"


def test_a_garbage_import_says_what_a_snapshot_is(a):
    for garbage in (b"definitely not a snapshot", b"\x10\0\0\0\0\0\0\0{nope}"):
        response = a.post(
            "/v1/sessions/import", content=garbage, headers={"Content-Type": "application/octet-stream"}
        )
        assert response.status_code == 400
        error = error_of(response)
        assert error == {
            "type": "invalid_request",
            "message": "the body is not a session snapshot (export one with GET /v1/sessions/{id}/snapshot)",
            "param": "body",
        }


def test_a_lone_surrogate_is_the_same_400_whether_or_not_the_field_has_constraints(a):
    session = create(a, text="x")
    # (Scoring reads its body with pydantic's JSON parser, which refuses the escape as not JSON: 422 `body`.)
    for path in ("/v1/sessions", f"/v1/sessions/{session['id']}/append", "/v1/memories"):
        raw = b'{"text": "\\ud800"}'
        response = a.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, (path, response.text)
        assert error_of(response) == {
            "type": "invalid_request", "message": "text is not valid Unicode (a lone surrogate)", "param": "text"
        }, path  # fmt: skip


def test_the_import_route_allows_only_post(a):
    allowed = a.options("/v1/sessions/import")
    assert allowed.status_code == 405 and allowed.headers["Allow"] == "POST"
    for method in ("GET", "DELETE"):
        refused = a.request(method, "/v1/sessions/import")
        assert refused.status_code == 405 and refused.headers["Allow"] == "POST", method
    assert a.options("/v1/sessions/abc").headers["Allow"] == "GET, DELETE"


def test_an_idempotency_key_outside_its_pattern_is_a_schema_error(a):
    for key in ("a b", "", "x" * 129, "a/b"):
        response = a.post("/v1/sessions", json={}, headers={"Idempotency-Key": key})
        assert response.status_code == 422, (key, response.text)
        assert error_of(response)["param"] == "Idempotency-Key"


def test_a_default_above_the_operators_most_is_lowered_to_it(tiny_model_dir, redis_server):
    """A request that leaves max_tokens out is never refused for it: the default (256 for a session's
    generation and a chat reply) is lowered to TXL_MAX_TOKENS."""
    for live in serve(tiny_model_dir, redis_server.url, "low-max", max_tokens=5, chat_template="transcript"):
        with live.client() as client:
            session = create(client, text="x")
            generated = client.post(f"/v1/sessions/{session['id']}/generate", json={})
            assert generated.status_code == 200 and generated.json()["usage"]["completion_tokens"] <= 5
            chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
            assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] <= 5
            schema = live.app.openapi()["components"]["schemas"]["GenerateRequest"]["properties"][
                "max_tokens"
            ]
            assert (schema["default"], schema["maximum"]) == (5, 5)


def test_a_snapshot_of_an_unchanged_session_is_the_same_bytes(a):
    session = create(a, text="Stable as a rock", metadata={"user": "ada", "tags": ["a", "b"], "n": 1})
    first = a.get(f"/v1/sessions/{session['id']}/snapshot")
    second = a.get(f"/v1/sessions/{session['id']}/snapshot")
    assert first.status_code == second.status_code == 200
    assert hashlib.sha256(first.content).hexdigest() == hashlib.sha256(second.content).hexdigest()
    # ... and it still imports.
    imported = a.post(
        "/v1/sessions/import", content=first.content, headers={"Content-Type": "application/octet-stream"}
    )
    assert imported.status_code == 201 and imported.json()["tokens"] == session["tokens"]


def test_internal_errors_leak_nothing(server, a, monkeypatch):
    service = server.app.state.runtime.service

    async def explode(*args, **kwargs):
        raise RuntimeError("secret internal detail /etc/passwd")

    monkeypatch.setattr(service, "list_sessions", explode)
    response = a.get("/v1/sessions")
    assert response.status_code == 500
    error = error_of(response)
    assert error == {"type": "internal", "message": "internal error", "param": None}


def test_health_ready_models_and_metrics(server, a):
    assert a.get("/health").json() == {"status": "ok"}
    assert a.get("/ready").json()["status"] == "ready"
    models = a.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny-byte"
    before = a.get("/metrics").text
    session = create(a, text="metrics please")
    a.post(f"/v1/sessions/{session['id']}/generate", json={"max_tokens": 5})
    after = a.get("/metrics").text

    def value(text, name):
        for line in text.splitlines():
            if line.startswith((name + " ", name + "{")):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    assert (
        value(after, 'txl_tokens_total{kind="generated"}')
        >= value(before, 'txl_tokens_total{kind="generated"}') + 5
    )
    assert (
        'txl_requests_total{method="POST",route="/v1/sessions/{session_id}/generate",status="200"}' in after
    )
    assert "txl_time_to_first_token_seconds_count" in after and "txl_batch_size_bucket" in after
    assert 'txl_memory_bytes{tier="device"}' in after
    assert "metrics please" not in after and session["id"] not in after  # no user text or ids in labels


# ---------------------------------------------------------------------------------------------- OpenAI


def test_official_openai_client_non_stream_and_stream(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_A)
    model = client.models.list().data[0].id
    full = client.completions.create(model=model, prompt="Once upon a time", max_tokens=20, temperature=0)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 20
    pieces = []
    for chunk in client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=20, temperature=0, stream=True
    ):
        pieces.extend(c.text for c in chunk.choices)
    assert "".join(pieces) == full.choices[0].text
    several = client.completions.create(
        model=model, prompt=["a", "b"], max_tokens=4, n=2, seed=3, temperature=1
    )
    assert sorted(c.index for c in several.choices) == [0, 1, 2, 3]


def test_unknown_routes_are_404_whatever_the_method_and_chat_says_what_to_use(server, a):
    for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
        response = a.request(method, "/v1/nope", json={})
        assert response.status_code == 404, (method, response.text)
        error = error_of(response)
        assert error["type"] == "not_found" and error["message"] == f"no such route: {method} /v1/nope"
    assert a.post("/index.html").status_code == 404  # the playground's files are only read
    assert a.get("/").status_code == 200
    wrong = a.put("/v1/sessions")
    assert wrong.status_code == 405 and wrong.headers["Allow"] == "GET, POST"
    assert error_of(wrong)["message"] == "PUT is not allowed on /v1/sessions; use GET or POST"

    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_A, max_retries=0)
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="tiny-byte", messages=[{"role": "user", "content": "Hi"}])
    message = refused.value.body["message"]
    assert "base language model" in message and "POST /v1/completions" in message
    assert "TXL_CHAT_TEMPLATE" in message


def test_completions_echo_logprobs_scores_the_prompt(a):
    prompt = "It was the best of times"
    scored = a.post(
        "/v1/completions", json={"prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 0}
    ).json()
    choice = scored["choices"][0]
    assert choice["text"] == prompt
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == prompt and len(logprobs["token_logprobs"]) == len(prompt)
    # As OpenAI: nothing in the prompt comes before its first token, so it has no log-prob.
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    # The chosen token is among the alternatives, added when it is not in the top 2 (as OpenAI does).
    added = 0
    for token, logprob, top in zip(
        logprobs["tokens"][1:], logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:], strict=True
    ):
        assert top[token] == logprob and len(top) in (2, 3)
        if len(top) == 3:
            added += 1
            assert logprob <= min(lp for text, lp in top.items() if text != token)
    assert added  # a random tiny model rarely picks the likeliest bytes of this prompt
    direct = a.post("/v1/score", json={"text": prompt, "token_logprobs": True}).json()
    assert logprobs["token_logprobs"][1:] == pytest.approx(direct["token_logprobs"][1:], rel=1e-5)


def test_completions_can_continue_a_session(a):
    session = create(a, text="Chapter 1.")
    response = a.post(
        "/v1/completions",
        json={"prompt": " It", "max_tokens": 5, "temperature": 0, "session_id": session["id"]},
    )
    assert response.status_code == 200, response.text
    after = a.get(f"/v1/sessions/{session['id']}").json()
    assert after["version"] == session["version"] + 1 and after["tokens"] == session["tokens"] + 3 + 5


def test_openapi_document_matches_the_committed_one():
    """docs/openapi.json is the document with the default settings (a server shows its own limits)."""
    import pathlib

    committed = pathlib.Path(__file__).parents[3] / "docs" / "openapi.json"
    generated = create_app(Settings()).openapi()
    assert json.loads(committed.read_text()) == json.loads(json.dumps(generated)), (
        "docs/openapi.json is stale: run `python -m txl_server.openapi > docs/openapi.json`"
    )


def test_the_served_document_shows_the_operators_limits(server):
    schemas = server.app.openapi()["components"]["schemas"]
    generate = schemas["GenerateRequest"]["properties"]
    assert generate["max_tokens"]["maximum"] == 256 and generate["max_tokens"]["default"] == 256
    assert generate["text"]["maxLength"] == 8 * 1024
    stop = generate["stop"]["anyOf"]
    assert stop[0] == {"type": "string", "minLength": 1, "maxLength": 8}
    assert stop[1]["maxItems"] == 2 and stop[1]["items"]["maxLength"] == 8
    assert "x-txl-limit" not in json.dumps(schemas)


def test_the_api_docs_example_body_makes_a_session_with_memory_that_lasts(server, a):
    """ReDoc and Swagger UI fill a request with the schema's example, else with each field's minimum: a session
    with mem_len 0 that expires after 1 s. The example given makes a useful one."""
    schema = server.app.openapi()["components"]["schemas"]["SessionCreate"]
    [example] = schema["examples"]
    session = create(a, **example)
    assert session["mem_len"] == 32 and session["mem_tokens"] > 1  # the model's default, holding the text
    assert session["expires_at"] - session["created_at"] >= 3600
    assert schema["properties"]["ttl_seconds"]["examples"] == [3600]


# ---------------------------------------------------------------------------------------------- separate servers


def test_too_many_concurrent_requests_get_429_with_retry_after(tiny_model_dir, redis_server):
    settings = Settings(
        model=tiny_model_dir, redis_url=redis_server.url, redis_prefix="c429:", max_concurrent_requests=1
    )
    with LiveServer(settings) as live, live.client() as client:
        session = create(client, text="It was a dark and stormy night")
        runner = live.app.state.runtime.worker.runner
        run = runner.run

        def slowly(
            decode, chunks, **kwargs
        ):  # a step of 10 ms: the stream below lasts 40 s unless it is left
            time.sleep(0.01)
            return run(decode, chunks, **kwargs)

        runner.run = slowly
        body = {"max_tokens": 4000, "stream": True}
        # The only slot, held by a stream (a request holds its slot until its last byte is sent).
        with (
            live.client() as holder,
            holder.stream("POST", f"/v1/sessions/{session['id']}/generate", json=body) as stream,
        ):
            next(stream.iter_lines())
            refused = client.get("/v1/sessions")
        assert refused.status_code == 429 and error_of(refused)["type"] == "overloaded"
        assert error_of(refused)["code"] == "server_concurrency"
        assert int(refused.headers["Retry-After"]) >= 1 and int(refused.headers["retry-after-ms"]) >= 1
        assert client.get("/health").status_code == 200
        deadline = time.monotonic() + 10  # the slot is free again once the stream's request has ended
        while (listed := client.get("/v1/sessions")).status_code == 429 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listed.status_code == 200


def test_dropped_memory_is_410_gone(tiny_model_dir, redis_server):
    settings = Settings(
        model=tiny_model_dir, redis_url=redis_server.url, redis_prefix="g410:", persistence=Persistence.NONE,
        device_memory_bytes=40_000, host_memory_bytes=1,
    )  # fmt: skip
    with LiveServer(settings) as live, live.client() as client:
        # Texts longer than mem_len (32): each session at rest holds a full memory, and two do not fit.
        first = create(client, text="one " * 10)
        create(client, text="two " * 10)
        response = client.post(f"/v1/sessions/{first['id']}/append", json={"text": "x"})
        assert response.status_code == 410 and error_of(response)["type"] == "gone"


def test_redis_down_gives_503_and_ready_reports_it(tiny_model_dir, tmp_path):
    from txl_server.sessions.redis_server import EmbeddedRedis

    redis = EmbeddedRedis(tmp_path / "r")
    redis.start()
    settings = Settings(model=tiny_model_dir, redis_url=redis.url)
    try:
        with LiveServer(settings) as live, live.client() as client:
            session = create(client, text="before")
            redis.kill()
            assert client.get("/ready").status_code == 503
            response = client.post(f"/v1/sessions/{session['id']}/append", json={"text": "x"})
            assert response.status_code == 503 and error_of(response)["type"] == "unavailable"
    finally:
        redis.stop()
