"""Every route's errors, as its OpenAPI document states them: each documented error status carries its family's
schema (OpenAI's on the OpenAI routes, the server's own elsewhere), and walking every route, each error it is made
to answer (no key, an unknown id, a body that is not JSON or nests 100,000 deep, a body over the limit, an
internal error, the shutdown) is a documented status whose body matches the documented schema."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from txl_server.api.shared.openai_errors import is_openai_path

from tests.helpers.live_server import LiveServer, serve

KEY = "key-error-shapes"
BODY_LIMIT = 256 * 1024  # above the 100,000-deep array's 200,000 bytes

# A body each route with a required one accepts, so that its other errors (an unknown id) are reached (else {}).
VALID_BODIES = {
    ("post", "/v1/sessions/{session_id}/append"): {"text": "x"},
    ("post", "/v1/sessions/{session_id}/rewind"): {"version": 1},
    ("post", "/v1/memories"): {"text": "x"},
    ("patch", "/v1/memories/{memory_id}"): {"name": "x"},
    ("post", "/v1/chat/completions"): {"messages": [{"role": "user", "content": "x"}]},
    ("post", "/v1/score"): {"text": "x"},
    ("post", "/v1/conversations/{conversation_id}"): {"metadata": {}},
    ("post", "/v1/conversations/{conversation_id}/items"): {"items": [{"role": "user", "content": "x"}]},
}


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server):
    yield from serve(
        tiny_model_dir,
        redis_server.url,
        "shapes",
        api_keys=KEY,
        chat_template="transcript",
        max_body_bytes=BODY_LIMIT,
    )


@pytest.fixture(scope="module")
def spec(server) -> dict[str, Any]:
    return server.app.openapi()


@pytest.fixture
def http(server) -> Iterator[httpx.Client]:
    with server.client(KEY) as client:
        yield client


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
    ]


def api_operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, method, op in operations(spec) if path.startswith("/v1/")]


def family_body(path: str) -> str:
    return "OpenAIErrorBody" if is_openai_path(path) else "ErrorBody"


def filled(path: str) -> str:
    """The path with an id that names nothing for each parameter."""
    return re.sub(r"\{[^}]+\}", "no-such-id", path)


def valid_body(path: str, method: str, operation: dict[str, Any]) -> Any:
    if "application/json" not in operation.get("requestBody", {}).get("content", {}):
        return None
    return VALID_BODIES.get((method, path), {})


def check_documented(
    spec: dict[str, Any], path: str, method: str, response: httpx.Response
) -> dict[str, Any]:
    """Asserts that the route documents the response's status, with its family's schema, and that the body
    matches that schema; returns the error object."""
    documented = spec["paths"][path][method]["responses"].get(str(response.status_code))
    assert documented is not None, f"{method.upper()} {path}: {response.status_code} is not documented"
    schema = documented["content"]["application/json"]["schema"]
    assert schema == {"$ref": f"#/components/schemas/{family_body(path)}"}, (path, response.status_code)
    Draft202012Validator({**schema, "components": spec["components"]}).validate(response.json())
    return dict(response.json()["error"])


def test_every_documented_error_status_has_its_familys_schema(spec):
    for path, method, operation in operations(spec):
        for status, documented in operation["responses"].items():
            if int(status) < 400:
                continue
            schema = documented["content"]["application/json"]["schema"]
            assert schema == {"$ref": f"#/components/schemas/{family_body(path)}"}, (method, path, status)
        if is_openai_path(path):
            assert "422" not in operation["responses"], (method, path)  # OpenAI answers a schema error 400


def test_every_api_route_needs_its_key_and_says_so_in_its_shape(server, spec):
    with server.client() as anonymous:
        for path, method, operation in api_operations(spec):
            assert operation["security"] == [{"ApiKey": []}], (method, path)
            response = anonymous.request(method, filled(path))
            assert response.status_code == 401, (method, path, response.text)
            error = check_documented(spec, path, method, response)
            if is_openai_path(path):
                assert error["code"] == "invalid_api_key"


def test_an_unknown_id_is_a_documented_404(http, spec):
    for path, method, operation in api_operations(spec):
        if "{" not in path:
            continue
        response = http.request(method, filled(path), json=valid_body(path, method, operation))
        assert response.status_code == 404, (method, path, response.text)
        error = check_documented(spec, path, method, response)
        if path == "/v1/models/{model}":
            assert error["code"] == "model_not_found"


def test_an_unknown_model_is_404_model_not_found_on_every_openai_route(http, spec):
    for path, body in [
        ("/v1/completions", {"prompt": "x", "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
        ("/v1/responses", {"input": "x", "max_output_tokens": 1}),
    ]:
        response = http.post(path, json={**body, "model": "gpt-4o"})
        assert response.status_code == 404, (path, response.text)
        error = check_documented(spec, path, "post", response)
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "model_not_found",
            "model",
        )
    response = http.get("/v1/models/gpt-4o")
    assert check_documented(spec, "/v1/models/{model}", "get", response)["code"] == "model_not_found"


@pytest.mark.parametrize(
    "raw",
    [b'{"text": ', b"[" * 100_000 + b"]" * 100_000],
    ids=["not JSON", "an array 100,000 deep"],
)
def test_a_body_that_cannot_be_read_is_a_documented_422_naming_the_body(http, spec, raw):
    """A schema error: 422 on the server's routes, 400 on OpenAI's (as OpenAI answers)."""
    for path, method, operation in api_operations(spec):
        content = operation.get("requestBody", {}).get("content", {})
        if "application/json" not in content:
            continue
        response = http.request(
            method, filled(path), content=raw, headers={"Content-Type": "application/json"}
        )
        expected = 400 if is_openai_path(path) else 422
        assert response.status_code == expected, (method, path, response.text)
        error = check_documented(spec, path, method, response)
        assert error["param"] == "body" and "not valid JSON" in error["message"], (path, error)


def test_a_body_over_the_limit_is_a_documented_413(http, spec):
    for path, method, operation in api_operations(spec):
        if "requestBody" not in operation:
            continue
        response = http.request(method, filled(path), content=b"x" * (BODY_LIMIT + 1))
        assert response.status_code == 413, (method, path, response.text)
        check_documented(spec, path, method, response)


def test_an_internal_error_is_a_documented_500_that_leaks_nothing(server, http, spec, monkeypatch):
    def explode(authorization: str | None) -> str:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(server.app.state.api_keys, "tenant", explode)
    for path, method, operation in api_operations(spec):
        response = http.request(method, filled(path), json=valid_body(path, method, operation))
        assert response.status_code == 500, (method, path, response.text)
        error = check_documented(spec, path, method, response)
        assert error["message"] == "internal error" and "secret" not in response.text
        assert response.headers["X-TXL-Replica"], path


def test_while_shutting_down_every_route_answers_a_documented_503(server: LiveServer, http, spec):
    shutdown = server.app.state.shutdown
    shutdown.closing = True
    try:
        for path, method, _ in api_operations(spec):
            response = http.request(method, filled(path))
            assert response.status_code == 503, (method, path, response.text)
            assert check_documented(spec, path, method, response)["code"] == "server_shutting_down"
            assert response.headers["Retry-After"] == "1"
    finally:
        shutdown.closing = False
