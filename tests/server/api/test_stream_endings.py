"""Every stream, on every route, ends properly whatever cuts it short: an error in the middle (a fault injected into
the worker after a few tokens, as the engine reports a step that failed) or the server shutting down. Each ends
in its route's own format: OpenAI's error object then `[DONE]` on completions and chat (the official client raises
the error, never APIConnectionError), the server's `error` event then `[DONE]` on sessions, an `error` event on the
Responses API; and the server logs no "Exception in ASGI application"."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest
from txl_server.engine.jobs import AdvanceJob, ErrorEvent, GenerateJob, ProgressEvent, TokenEvent

from tests.helpers.live_server import LiveServer, client_of, serve
from tests.server.test_shutdown import Stream

TOKENS_BEFORE_THE_FAULT = 3


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server):
    yield from serve(tiny_model_dir, redis_server.url, "endings", chat_template="transcript")


@pytest.fixture
def http(server):
    yield from client_of(server)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


class AsgiErrors(logging.Handler):
    """What uvicorn logs when an application raises out of a request (a connection cut mid-response)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(autouse=True)
def asgi_errors() -> Iterator[AsgiErrors]:
    handler = AsgiErrors()
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    assert not [m for m in handler.messages if "Exception in ASGI application" in m], handler.messages


@contextlib.contextmanager
def failing_jobs(
    server: LiveServer, kind: type = GenerateJob, after: int = TOKENS_BEFORE_THE_FAULT
) -> Iterator[None]:
    """Every job of `kind` fails after `after` of its tokens (or progress reports): the worker reports an error
    for it, as it does for a step that raised."""
    worker = server.app.state.runtime.worker
    submit = worker.submit

    def faulty(job) -> None:
        if isinstance(job, kind):
            _fail_after(job, after)
        submit(job)

    worker.submit = faulty
    try:
        yield
    finally:
        del worker.submit


def failing_generations(server: LiveServer, after: int = TOKENS_BEFORE_THE_FAULT):
    return failing_jobs(server, GenerateJob, after)


def _fail_after(job, after: int) -> None:
    emit = job.emit
    sent, failed = 0, threading.Event()

    def emit_then_fail(event) -> None:
        nonlocal sent
        if failed.is_set():
            return
        if isinstance(event, TokenEvent | ProgressEvent):
            sent += 1
            if sent > after:
                failed.set()
                job.cancel()
                emit(ErrorEvent(RuntimeError("injected fault: secret detail")))
                return
        emit(event)

    job.emit = emit_then_fail


def data_lines(response: httpx.Response) -> list:
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# ---------------------------------------------------------------------------------------------- a fault


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_a_fault_mid_stream_is_openais_error_event_then_done(server, http, client, route):
    body = {"max_tokens": 50, "stream": True, "temperature": 0}
    if route == "chat":
        path, body = "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "Hi"}]}
    else:
        path, body = "/v1/completions", {**body, "prompt": "Once", "n": 2}
    with failing_generations(server), http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        events = data_lines(response)
    assert events[-1] == "[DONE]"
    assert events[-2] == {
        "error": {"message": "internal error", "type": "server_error", "param": None, "code": "internal"}
    }
    assert any("choices" in event for event in events[:-2])  # it failed after it began

    # The official client raises OpenAI's error (not APIConnectionError), with what it said.
    with failing_generations(server), pytest.raises(openai.APIError) as caught:
        if route == "chat":
            stream = client.chat.completions.create(
                model="tiny-byte", messages=[{"role": "user", "content": "Hi"}], max_tokens=50, stream=True
            )
        else:
            stream = client.completions.create(model="tiny-byte", prompt="Once", max_tokens=50, stream=True)
        for _ in stream:
            pass
    assert not isinstance(caught.value, openai.APIConnectionError)
    assert (caught.value.type, caught.value.code, caught.value.message) == (
        "server_error", "internal", "internal error"
    )  # fmt: skip


def test_a_fault_before_the_answer_is_openais_500(server, client):
    with failing_generations(server, after=0), pytest.raises(openai.InternalServerError) as caught:
        client.completions.create(model="tiny-byte", prompt="Once", max_tokens=5)
    assert caught.value.status_code == 500
    assert caught.value.body == {
        "message": "internal error", "type": "server_error", "param": None, "code": "internal"
    }  # fmt: skip


def test_a_fault_mid_stream_ends_a_session_stream_with_its_error_event_then_done(server, http):
    session = http.post("/v1/sessions", json={"text": "Once upon"}).json()
    body = {"max_tokens": 50, "stream": True}
    with (
        failing_generations(server),
        http.stream("POST", f"/v1/sessions/{session['id']}/generate", json=body) as response,
    ):
        events = data_lines(response)
    assert [e["type"] for e in events[:-2]] == ["token"] * TOKENS_BEFORE_THE_FAULT
    assert events[-2] == {
        "type": "error", "error": {"type": "internal", "message": "internal error", "param": None}
    }  # fmt: skip
    assert events[-1] == "[DONE]"
    assert http.get(f"/v1/sessions/{session['id']}").json()["version"] == session["version"]  # nothing kept


def test_a_fault_mid_stream_ends_a_response_with_an_error_event_then_failed_then_done(server, http):
    body = {"input": "Once", "max_output_tokens": 50, "stream": True}
    with failing_generations(server), http.stream("POST", "/v1/responses", json=body) as response:
        events = data_lines(response)
    assert events[-1] == "[DONE]"
    error, failed = events[-3], events[-2]
    assert error["type"] == "error" and (error["code"], error["message"]) == ("internal", "internal error")
    assert failed["type"] == "response.failed" and failed["response"]["error"]["code"] == "internal"
    assert [e["sequence_number"] for e in events[:-1]] == list(range(len(events) - 1))
    assert sum(e["type"] == "response.output_text.delta" for e in events[:-1]) >= 1


@pytest.mark.parametrize("route", ["append", "memory", "score"])
def test_a_fault_mid_way_ends_a_long_work_stream_with_its_error_event_then_done(server, http, route):
    text = "It was the best of times, it was the worst of times. " * 60
    session = http.post("/v1/sessions", json={"text": "x"}).json()
    path, body = {
        "append": (f"/v1/sessions/{session['id']}/append", {"text": text, "stream": True}),
        "memory": ("/v1/memories", {"text": text, "stream": True}),
        "score": ("/v1/score", {"text": text, "stream": True}),
    }[route]
    with failing_jobs(server, AdvanceJob, after=1), http.stream("POST", path, json=body) as response:
        assert response.status_code in (200, 201), response.read()
        events = data_lines(response)
    assert events[0]["type"] == "progress"
    assert events[-2] == {
        "type": "error", "error": {"type": "internal", "message": "internal error", "param": None}
    }  # fmt: skip
    assert events[-1] == "[DONE]"


# ---------------------------------------------------------------------------------------------- the shutdown


def test_the_shutdown_ends_every_stream_in_its_routes_format(tiny_model_dir, redis_server):
    """Streams still running at the end of the grace period are stopped, each ended as its route ends an error
    (code server_shutting_down); a new request is refused in its family's shape."""
    servers = serve(
        tiny_model_dir,
        redis_server.url,
        "endings-shutdown",
        chat_template="transcript",
        shutdown_grace_seconds=1.0,
        max_tokens=100_000,
    )
    server = next(servers)
    try:
        with server.client() as http:
            session = http.post("/v1/sessions", json={"text": "Once upon"}).json()
            long = {"max_tokens": 100_000, "stream": True, "temperature": 0}
            requests = {
                "completions": ("/v1/completions", {**long, "prompt": "Once"}),
                "chat": ("/v1/chat/completions", {**long, "messages": [{"role": "user", "content": "Hi"}]}),
                "session": (f"/v1/sessions/{session['id']}/generate", long),
                "responses": (
                    "/v1/responses",
                    {"input": "Once", "max_output_tokens": 100_000, "stream": True, "temperature": 0},
                ),
            }
            readers = {name: Stream(server.url, *request) for name, request in requests.items()}
            for reader in readers.values():
                reader.start()
            for name, reader in readers.items():
                assert reader.first.wait(60) and reader.error is None, (name, reader.error)
            draining = asyncio.run_coroutine_threadsafe(server.app.state.shutdown.drain(), server.loop)
            for reader in readers.values():
                reader.join(60)
            draining.result(timeout=60)
            refused = http.post("/v1/completions", json={"prompt": "x"})
            native_refusal = http.get("/v1/sessions")
    finally:
        with contextlib.suppress(StopIteration):
            next(servers)
    stopped = "the server is shutting down and stopped this request before its end"
    completions = payloads(readers["completions"])
    assert completions[-1] == "[DONE]" and completions[-2]["error"]["code"] == "server_shutting_down"
    assert (
        completions[-2]["error"]["type"] == "server_error" and stopped in completions[-2]["error"]["message"]
    )
    chat = payloads(readers["chat"])
    assert chat[-1] == "[DONE]" and chat[-2]["error"]["code"] == "server_shutting_down"
    native = payloads(readers["session"])
    assert native[-1] == "[DONE]" and native[-2]["type"] == "error"
    assert (
        native[-2]["error"]["code"] == "server_shutting_down" and native[-2]["error"]["type"] == "unavailable"
    )
    responses = payloads(readers["responses"])
    assert responses[-1] == "[DONE]" and responses[-2]["type"] == "response.failed"
    assert responses[-3]["type"] == "error" and responses[-3]["code"] == "server_shutting_down"
    numbers = [event["sequence_number"] for event in responses[:-1]]
    assert numbers == list(range(len(numbers)))
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_error"
    assert refused.json()["error"]["code"] == "server_shutting_down" and set(refused.json()["error"]) == {
        "message", "type", "param", "code"
    }  # fmt: skip
    assert native_refusal.status_code == 503 and native_refusal.json()["error"]["type"] == "unavailable"


def payloads(stream: Stream) -> list:
    assert stream.error is None, stream.error
    return [line if line == "[DONE]" else json.loads(line) for line in stream.events]
