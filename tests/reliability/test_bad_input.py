"""Hostile and malformed input: every case is a clean 4xx in the one error shape (never a 500), changes nothing,
and a corrupt model directory stops the server at start-up with one clear line.

tests/server/api/test_api.py already covers: invalid UTF-8 in text/plain scoring, NaN temperature on generate, the
basic generate limits (max_tokens 10**6, negative values, stop strings), oversized append and streamed bodies,
empty append, form-encoded append. The cases below are the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from txl_server.sessions.redis_server import free_port

from tests.helpers.server_process import REPO
from tests.helpers.sse import sse_payloads

from .servers import OPENAI_INVALID, error_of

JSON = {"Content-Type": "application/json"}


def create(client: httpx.Client, **body) -> dict:
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def assert_refused(response: httpx.Response, *statuses: int) -> dict:
    assert response.status_code in statuses, (response.status_code, response.text)
    return error_of(response)


@pytest.fixture
def session(a) -> dict:
    return create(a, text="bad input target")


def unchanged(client: httpx.Client, session: dict) -> None:
    after = client.get(f"/v1/sessions/{session['id']}").json()
    assert (after["version"], after["tokens"], after["mem_tokens"]) == (
        session["version"], session["tokens"], session["mem_tokens"]
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- encodings


def test_invalid_utf8_in_a_json_body_is_refused_on_every_text_route(a, session):
    sid = session["id"]
    raw = b'{"text": "abc\xff\xfe\xc3"}'
    for path in ("/v1/sessions", f"/v1/sessions/{sid}/append", f"/v1/sessions/{sid}/generate", "/v1/score"):
        error = assert_refused(a.post(path, content=raw, headers=JSON), 400, 422)
        assert error["type"] == "invalid_request", path
    bad_prompt = b'{"prompt": "\xff", "max_tokens": 1}'
    assert (
        assert_refused(a.post("/v1/completions", content=bad_prompt, headers=JSON), 400)["type"]
        == OPENAI_INVALID
    )
    unchanged(a, session)


@pytest.mark.parametrize("escaped", ["\\ud800", "\\udfff", "a\\ud83d", "\\udc00\\ud800"])
def test_lone_surrogates_are_refused_or_handled_never_a_500(c, escaped):
    """JSON may escape a lone surrogate (`"\\ud800"`), which no UTF-8 text can hold. Whatever the server
    decides (refuse, or keep the code point as bytes), it must answer in the error shape or succeed, and the
    tenant's sessions must stay readable afterwards. (Tenant C: a failure here must not spoil other tests.)"""
    sid = create(c, text="surrogates")["id"]
    cases = [
        ("/v1/sessions", '{"text": "%s"}'),
        (f"/v1/sessions/{sid}/append", '{"text": "%s"}'),
        (f"/v1/sessions/{sid}/generate", '{"text": "%s", "max_tokens": 2}'),
        ("/v1/score", '{"text": "x%s"}'),
        ("/v1/completions", '{"prompt": "%s", "max_tokens": 2}'),
        ("/v1/completions", '{"prompt": "%s", "max_tokens": 0, "echo": true}'),
        ("/v1/completions", '{"prompt": "%s", "max_tokens": 1, "echo": true, "logprobs": 1}'),
        ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "stop": ["%s"], "user": "%s"}'),
        (f"/v1/sessions/{sid}/generate", '{"stop": ["%s"], "max_tokens": 2}'),
        ("/v1/sessions", '{"metadata": {"k": "%s"}}'),
        ("/v1/sessions", '{"metadata": {"%s": 1}}'),
        (f"/v1/sessions/{sid}/fork", '{"metadata": {"k": ["%s"]}}'),
    ]
    broken = []
    for path, template in cases:
        with httpx.Client(base_url=str(c.base_url), headers=c.headers, timeout=30) as fresh:
            # A fresh connection per case: after a 500, uvicorn drops the connection.
            response = fresh.post(path, content=(template.replace("%s", escaped)).encode(), headers=JSON)
        if response.status_code >= 500:
            broken.append(f"{path} {template}: {response.status_code} {response.text}")
        elif response.status_code >= 400:
            expected = OPENAI_INVALID if path == "/v1/completions" else "invalid_request"
            assert error_of(response)["type"] == expected, (path, template)
        else:
            response.json()  # a successful answer must still be valid JSON
    listing = c.get("/v1/sessions")
    if listing.status_code != 200:
        broken.append(f"afterwards GET /v1/sessions: {listing.status_code} {listing.text}")
    for session in listing.json().get("data", []) if listing.status_code == 200 else []:
        c.delete(f"/v1/sessions/{session['id']}")
    assert not broken, "\n".join(broken)


def test_a_streamed_echo_of_a_lone_surrogate_is_not_a_broken_stream(c):
    raw = b'{"prompt": "\\ud800", "max_tokens": 2, "echo": true, "stream": true}'
    with c.stream("POST", "/v1/completions", content=raw, headers=JSON) as response:
        if response.status_code != 200:
            assert response.status_code < 500
            return
        try:
            events = sse_payloads(list(response.iter_lines()))
        except httpx.RemoteProtocolError as exc:
            pytest.fail(f"the stream broke off: {exc}")
    assert events[-1] == "[DONE]"
    assert not [e for e in events[:-1] if "error" in e], events


def test_text_with_unicode_line_separators_never_splits_a_stream_event(a):
    """SSE ends lines only at CR/LF, but common clients (httpx's iter_lines, which the project's own Python
    client uses; anything built on str.splitlines) also split at U+0085, U+2028 and U+2029. A byte-level model
    generates them (0xC2 0x85 is NEL), and an echoed prompt carries them: every event must survive
    `iter_lines`."""
    prompt = "a\u2028b\u0085c\u2029d"
    body = {"prompt": prompt, "max_tokens": 2, "echo": True, "stream": True}
    with a.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    broken = [line for line in lines if not line.startswith("data: ")]
    assert not broken, f"iter_lines split events at a Unicode line separator: {broken}"
    events = sse_payloads(lines)
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["text"] == prompt


# ---------------------------------------------------------------------------------------------- sizes


def test_oversized_bodies_get_413_on_every_body_route(a, session):
    sid = session["id"]
    big = "x" * (70 * 1024)  # the body limit is 64 KiB
    for path, body in (
        ("/v1/sessions", {"text": big}),
        ("/v1/sessions", {"metadata": {"k": big}}),
        (f"/v1/sessions/{sid}/generate", {"text": big}),
        (f"/v1/sessions/{sid}/fork", {"metadata": {"k": big}}),
        ("/v1/completions", {"prompt": big}),
        ("/v1/score", {"text": big}),
    ):
        error = assert_refused(a.post(path, json=body), 413)
        assert error.get("code", error["type"]) == "payload_too_large", path
    blob = a.post(
        "/v1/sessions/import",
        content=b"\0" * (70 * 1024),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert assert_refused(blob, 413)["type"] == "payload_too_large"
    # A text over TXL_MAX_TEXT_CHARS (8 KiB) inside a body under the limit is 413 too.
    assert assert_refused(a.post("/v1/completions", json={"prompt": "y" * 9000}), 413)["param"] == "prompt"
    unchanged(a, session)


@pytest.mark.parametrize("max_tokens", [65, 10**12, 2**63, 10**30, 1e300])
def test_huge_max_tokens_is_refused(a, session, max_tokens):
    for path, body in (
        (f"/v1/sessions/{session['id']}/generate", {"max_tokens": max_tokens}),
        ("/v1/completions", {"prompt": "x", "max_tokens": max_tokens}),
        ("/v1/completions", {"prompt": "x", "max_tokens": max_tokens, "session_id": session["id"]}),
    ):
        error = assert_refused(a.post(path, json=body), 400, 422)
        assert error["param"] is not None and "max_tokens" in error["param"], (path, error)
    unchanged(a, session)


# ---------------------------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_non_finite_sampling_values_are_refused(a, session, literal, field):
    raw = f'{{"{field}": {literal}, "max_tokens": 2}}'.encode()
    generate = a.post(f"/v1/sessions/{session['id']}/generate", content=raw, headers=JSON)
    assert assert_refused(generate, 422)["param"] == field
    raw = f'{{"prompt": "x", "{field}": {literal}, "max_tokens": 2}}'.encode()
    assert assert_refused(a.post("/v1/completions", content=raw, headers=JSON), 400)["param"] == field
    unchanged(a, session)


@pytest.mark.parametrize(
    "body",
    [
        {"top_k": -1},
        {"temperature": -1e-9},
        {"temperature": 101},
        {"seed": 2**63},
        {"max_tokens": 1.5},
        {"max_tokens": "eight"},
        {"stream": "maybe"},
        {"stop": [1]},
    ],
)
def test_out_of_range_generate_values_are_refused(a, session, body):
    response = a.post(f"/v1/sessions/{session['id']}/generate", json={**body, "max_tokens": 2} | body)
    assert assert_refused(response, 400, 422)["type"] == "invalid_request"
    unchanged(a, session)


@pytest.mark.parametrize(
    "body",
    [
        {"temperature": -0.1},
        {"temperature": 2.5},
        {"top_p": 0},
        {"logprobs": 6},
        {"logprobs": -1},
        {"n": 0},
        {"n": 9},
        {"prompt": [300]},
        {"prompt": [-1]},
        {"prompt": [[1, 2], [256]]},
        {"prompt": ["a"] * 65},
        {"seed": -5},
        {"frequency_penalty": 0.5},
        {"suffix": "x"},
        {"best_of": 3},
        {"model": "not-this-one"},
    ],
)
def test_out_of_range_completion_values_are_refused(a, body):
    """As OpenAI: 400 invalid_request_error, whatever refused the value (the schema or the server); an
    unknown model is 404 model_not_found."""
    response = a.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, **body})
    status = 404 if "model" in body else 400
    assert assert_refused(response, status)["type"] == OPENAI_INVALID


def test_mem_len_and_ttl_bounds(a):
    for body in ({"ttl_seconds": 10**12}, {"ttl_seconds": -1}, {"mem_len": 2**70}, {"mem_len": 1.5}):
        assert assert_refused(a.post("/v1/sessions", json=body), 400, 422)["type"] == "invalid_request"
    assert assert_refused(a.post("/v1/sessions/import?ttl_seconds=0", content=b"x"), 400, 422)


# ---------------------------------------------------------------------------------------------- shapes


def test_unknown_fields_are_refused_on_session_routes_and_ignored_on_completions(a, session):
    sid = session["id"]
    for path, body in (
        (f"/v1/sessions/{sid}/append", {"text": "x", "extra": 1}),
        (f"/v1/sessions/{sid}/fork", {"metadata": {}, "parent": "x"}),
    ):
        error = assert_refused(a.post(path, json=body), 422)
        assert error["type"] == "invalid_request", path
    # /v1/score validates its JSON itself (it also takes text/plain): 400 rather than the documented 422.
    assert (
        assert_refused(a.post("/v1/score", json={"text": "x", "unknown": True}), 400, 422)["param"]
        == "unknown"
    )
    unchanged(a, session)
    # OpenAI clients send options freely: unknown fields are ignored (docs/api.md).
    ok = a.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "logit_bias": {}, "zzz": [1]})
    assert ok.status_code == 200, ok.text


def test_empty_texts(a, session):
    sid = session["id"]
    empty = create(a, text="")  # a session may start empty
    assert empty["tokens"] == 0 and empty["mem_tokens"] == 1  # the separator
    generated = a.post(f"/v1/sessions/{empty['id']}/generate", json={"text": "", "max_tokens": 3})
    assert generated.status_code == 200 and generated.json()["usage"]["completion_tokens"] == 3
    for prompt in ("", [], [[]], [""]):
        response = a.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        assert response.status_code in (200, 400), (prompt, response.text)
        if response.status_code == 400:
            assert error_of(response)["type"] == OPENAI_INVALID
    nothing = a.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 0})
    assert nothing.status_code == 200 and nothing.json()["text"] == ""
    assert assert_refused(a.post(f"/v1/sessions/{sid}/append", json={}), 422)["param"] == "text"


@pytest.mark.parametrize("depth", [5, 200, 2_000, 10_000])
def test_deeply_nested_metadata_is_refused_without_crashing_the_parser(a, session, depth):
    nested = "[" * depth + "]" * depth
    for path in ("/v1/sessions", f"/v1/sessions/{session['id']}/fork"):
        raw = f'{{"metadata": {{"k": {nested}}}}}'.encode()
        error = assert_refused(a.post(path, content=raw, headers=JSON), 400, 422)
        assert error["type"] == "invalid_request", (path, depth)
    # Deep nesting anywhere in a body, even where no nesting is expected, is refused the same way.
    raw = f'{{"text": "x", "junk": {nested}}}'.encode()
    assert assert_refused(a.post("/v1/score", content=raw, headers=JSON), 400, 422)
    raw = f'{{"prompt": "x", "max_tokens": 1, "junk": {nested}}}'.encode()
    response = a.post("/v1/completions", content=raw, headers=JSON)
    assert response.status_code < 500, response.text
    unchanged(a, session)


def test_stop_strings_over_the_limits_on_completions(a):
    for stop in (["a", "b", "c"], "way too long", [""], ["ok", "x" * 9]):
        response = a.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "stop": stop})
        assert assert_refused(response, 400)["param"] == "stop", stop
    assert assert_refused(a.post("/v1/completions", json={"prompt": "x", "stop": [1]}), 400)


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/xml", "multipart/form-data; boundary=x", "", "application/jsonx"],
)
def test_wrong_content_types_are_refused(a, session, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    body = json.dumps({"text": "hello", "max_tokens": 1}).encode()
    sid = session["id"]
    for path in ("/v1/sessions", f"/v1/sessions/{sid}/append", f"/v1/sessions/{sid}/generate"):
        response = a.post(path, content=body, headers=headers)
        # Refused, or (for a missing content type) read as JSON; never a 500.
        assert response.status_code < 500, (path, content_type, response.text)
        if response.status_code >= 400:
            assert error_of(response)["type"] == "invalid_request"
    garbage = a.post("/v1/sessions", content=b"{not json", headers=JSON)
    assert assert_refused(garbage, 422)["type"] == "invalid_request"
    assert assert_refused(a.post("/v1/sessions", content=b"[]", headers=JSON), 422)
    assert assert_refused(a.post("/v1/sessions", content=b'"text"', headers=JSON), 422)
    # `null` is no options at all, like an omitted body (create takes an empty body, as fork does)
    assert a.post("/v1/sessions", content=b"null", headers=JSON).status_code == 201


def test_garbage_session_ids_and_headers(a, session):
    for bad_id in ("x" * 5000, "..%2F..%2Fetc", "%00", "a b", "\u00e9\u4e2d"):
        response = a.get(f"/v1/sessions/{bad_id}")
        assert response.status_code in (404, 414, 400), (bad_id, response.status_code)
    sid = session["id"]
    for key in ("k" * 129, "a/b", "bad key", "ümlaut", "x;y"):
        response = a.post(f"/v1/sessions/{sid}/fork", headers={"Idempotency-Key": key.encode()})
        # Outside the header's pattern: a request that does not match the schema (422).
        assert response.status_code in (422, 201), (key, response.text)
        if response.status_code == 422:
            assert error_of(response)["param"] == "Idempotency-Key"
    corrupt = [b"", b"\0" * 8, (10**12).to_bytes(8, "little") + b"{}", b'\x10\0\0\0\0\0\0\0{"a":1}       ']
    for blob in corrupt:
        response = a.post(
            "/v1/sessions/import", content=blob, headers={"Content-Type": "application/octet-stream"}
        )
        assert assert_refused(response, 400)["type"] == "invalid_request", blob


# ---------------------------------------------------------------------------------------------- start-up


def start_with_models(model_dirs: dict[str, Path], tmp_path: Path) -> dict[str, tuple[int, str, float]]:
    """Starts one server per directory, all at once (each fails at start-up); exit code, output, seconds."""
    started = time.monotonic()
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("TXL_")}
    processes = {
        name: subprocess.Popen(
            # A free port: the port is checked before the model is loaded (port 1 is refused to non-root users).
            [sys.executable, "-m", "txl_server", "--model", str(model_dir), "--port", str(free_port())],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env={**clean_env, "TXL_REDIS_DATA_DIR": str(tmp_path / name)},
        )
        for name, model_dir in model_dirs.items()
    }
    results = {}
    for name, process in processes.items():
        try:
            output, _ = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        results[name] = (process.returncode, output, time.monotonic() - started)
    return results


def corrupt_model_dirs(good: Path, tmp_path: Path) -> dict[str, Path]:
    dirs = {}
    for name in (
        "truncated-weights",
        "garbage-weights",
        "malformed-config",
        "config-not-an-object",
        "no-tokenizer",
    ):
        dirs[name] = tmp_path / name
        shutil.copytree(good, dirs[name])
    weights = good / "model.safetensors"
    data = weights.read_bytes()
    (dirs["truncated-weights"] / "model.safetensors").write_bytes(data[: len(data) // 2])
    (dirs["garbage-weights"] / "model.safetensors").write_bytes(b"\x07" * 4096)
    (dirs["malformed-config"] / "config.json").write_text('{"d_model": 32, "n_layer": ')
    (dirs["config-not-an-object"] / "config.json").write_text("[1, 2, 3]")
    (dirs["no-tokenizer"] / "tokenizer.json").unlink()
    dirs["missing-directory"] = tmp_path / "does-not-exist"
    return dirs


@pytest.mark.slow
def test_a_corrupt_or_missing_model_stops_start_up_with_one_clear_line(tiny_model_dir, tmp_path, figures):
    outcomes = {}
    failures = []
    model_dirs = corrupt_model_dirs(tiny_model_dir, tmp_path)
    for name, (code, output, seconds) in start_with_models(model_dirs, tmp_path).items():
        model_dir = model_dirs[name]
        lines = [line for line in output.splitlines() if line.strip()]
        outcomes[name] = {"exit_code": code, "lines": len(lines), "seconds": round(seconds, 1)}
        traceback = any("Traceback" in line for line in lines)
        mentions = str(model_dir) in output or model_dir.name in output
        if code == 0 or traceback or not mentions or len(lines) > 3:
            failures.append(f"{name}: exit {code}, {len(lines)} lines:\n" + "\n".join(lines[-12:]))
    figures.record("startup_failures", outcomes)
    assert not failures, "\n\n".join(failures)
