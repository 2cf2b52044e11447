"""How answers are written, whichever part of the server writes them: JSON compact and ending with a newline, in
both error shapes (the OpenAI routes' were written with spaces); and the OpenAPI document describing the server
that serves it (a server without keys declared every route as needing one, and a fuzzer took that at its word)."""

from __future__ import annotations

import json

import pytest
from txl_server.api.app import create_app
from txl_server.api.shared.json_response import json_bytes
from txl_server.settings import Settings

from tests.helpers.live_server import client_fixture, live_server_fixture

server = live_server_fixture("written", chat_template="transcript")
client = client_fixture()


def written_as_the_server_writes(body: bytes) -> bool:
    """Whether `body` is JSON written compact and ending with one newline."""
    return body == json_bytes(json.loads(body))


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/v1/models", None, 200),  # an answer
        ("GET", "/v1/sessions/nope", None, 404),  # the server's error shape
        ("POST", "/v1/sessions", {"text": 1}, 422),  # a request that does not match the schema
        ("POST", "/v1/completions", {"model": "gpt-4o", "prompt": "x"}, 404),  # OpenAI's shape
        ("POST", "/v1/completions", {"model": "tiny", "prompt": "x", "temperature": -1}, 400),
        ("GET", "/health", None, 200),
    ],
)
def test_json_answers_are_compact_and_end_with_a_newline(client, method, path, body, status):
    response = client.request(method, path, json=body)
    assert response.status_code == status, response.text
    assert response.content.endswith(b"}\n") and written_as_the_server_writes(response.content), (
        response.content
    )


def test_the_openapi_document_of_a_server_without_keys_needs_none():
    spec = create_app(Settings()).openapi()
    operation = spec["paths"]["/v1/sessions"]["post"]
    assert operation["security"] == [{}, {"ApiKey": []}]  # no key needed; one sent is ignored
    assert "no API keys" in spec["components"]["securitySchemes"]["ApiKey"]["description"]
    guarded = [op for ops in spec["paths"].values() for op in ops.values() if op.get("security")]
    assert guarded and all({} in op["security"] for op in guarded)


def test_the_openapi_document_of_a_server_with_keys_requires_one():
    spec = create_app(Settings(api_keys="secret")).openapi()
    assert spec["paths"]["/v1/sessions"]["post"]["security"] == [{"ApiKey": []}]
    assert "no API keys" not in spec["components"]["securitySchemes"]["ApiKey"]["description"]
