"""A server process traced as an operator configures it (OTEL_EXPORTER_OTLP_ENDPOINT, the SDK's own variables)
sends its spans to an OTLP/HTTP receiver this test runs, which decodes the protobuf: a streamed session step and
a chained Responses turn sent with a traceparent are each one trace under the caller's trace id, with a server
span and its stages (lease, fetch, queue, prefill, decode, commit) and the GenAI attributes, and no prompt text. A
background response's work is a trace of its own, linked to the request that started it. Its JSON log lines
carry the same request ids and trace ids."""

from __future__ import annotations

import json
import time

import pytest
from txl_server.sessions.store.responses import parse_response_id

from tests.helpers.server_process import ServerProcess, process_env

from .otlp_receiver import OtlpReceiver, ReceivedSpan

KEY = "key-traces-7f3a9c"
SECRET_TEXT = "quagga"  # in every prompt: never in a span or a log line
STAGES = (
    "session.lease",
    "session.fetch",
    "engine.queue",
    "engine.prefill",
    "engine.decode",
    "session.commit",
)


def traceparent(trace_id: str, parent: str = "b7ad6b7169203331") -> str:
    return f"00-{trace_id}-{parent}-01"


@pytest.fixture(scope="module")
def receiver():
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir, redis_server, receiver):
    env = process_env(tiny_model_dir, redis_server.url, "traces")
    log = tmp_path_factory.mktemp("traces") / "server.log"
    with ServerProcess(
        log,
        **env,
        TXL_API_KEYS=KEY,
        TXL_LOG_FORMAT="json",
        TXL_LOG_LEVEL="info",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_SERVICE_NAME="txl-traces-test",
        OTEL_BSP_SCHEDULE_DELAY="50",  # ms between batches: the test waits for them
    ) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    with server.client(KEY) as client:
        yield client


def trace_of(receiver: OtlpReceiver, trace_id: str, *names: str) -> list[ReceivedSpan]:
    """The trace's spans once its server span and every span named have arrived."""

    def complete(spans: list[ReceivedSpan]) -> bool:
        mine = [s for s in spans if s.trace_id == trace_id]
        return any(s.is_server for s in mine) and all(any(s.name == n for s in mine) for n in names)

    return [s for s in receiver.wait_for(complete) if s.trace_id == trace_id]


def server_span(trace: list[ReceivedSpan]) -> ReceivedSpan:
    (server,) = [s for s in trace if s.is_server]  # one request, one server span
    return server


def assert_stages_under(trace: list[ReceivedSpan], server: ReceivedSpan) -> None:
    for span in trace:
        if span is server or span.name == "blocks.write":  # the commit's own child
            continue
        assert span.parent_span_id == server.span_id, span.name
        assert server.start_ns <= span.start_ns <= span.end_ns <= server.end_ns, span.name
        assert span.attributes["txl.request_id"] == server.attributes["txl.request_id"], span.name


def assert_no_text(spans: list[ReceivedSpan]) -> None:
    for span in spans:
        assert SECRET_TEXT not in json.dumps(span.attributes), (span.name, span.attributes)


def test_a_streamed_session_step_is_one_trace_under_the_callers_trace(client, receiver):
    session = client.post("/v1/sessions", json={"text": f"The {SECRET_TEXT} grazes"}).json()
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    headers = {"traceparent": traceparent(trace_id), "X-Request-Id": "step-42"}
    body = {"text": f" and the {SECRET_TEXT} runs", "max_tokens": 6, "stream": True, "top_k": 5}
    with client.stream(
        "POST", f"/v1/sessions/{session['id']}/generate", json=body, headers=headers
    ) as response:
        assert response.status_code == 200 and response.headers["x-request-id"] == "step-42"
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    usage = events[-1]["usage"]

    trace = trace_of(receiver, trace_id, *STAGES)
    server = server_span(trace)
    assert server.parent_span_id == "b7ad6b7169203331"  # the caller's span
    assert server.name == "POST /v1/sessions/{session_id}/generate"
    attributes = server.attributes
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/v1/sessions/{session_id}/generate"
    assert attributes["http.response.status_code"] == 200
    assert attributes["url.path"] == f"/v1/sessions/{session['id']}/generate"
    assert attributes["txl.request_id"] == "step-42"
    assert attributes["gen_ai.request.model"] == session["model"]
    assert attributes["gen_ai.conversation.id"] == session["id"]
    assert attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 6
    assert len(attributes["txl.tenant"]) == 32 and KEY not in json.dumps(attributes)
    assert server.resource["service.name"] == "txl-traces-test"
    assert_stages_under(trace, server)

    named = {s.name: s for s in trace}
    assert named["session.fetch"].attributes["txl.session.source"] == "device"
    prefill = [s for s in trace if s.name == "engine.prefill"]
    assert sum(s.attributes["txl.prefill.tokens"] for s in prefill) == usage["prompt_tokens"]
    assert all(s.attributes["txl.prefill.segments"] >= 1 for s in prefill)
    (decode,) = [s for s in trace if s.name == "engine.decode"]  # one span for all its tokens
    assert decode.attributes["txl.decode.steps"] == decode.attributes["txl.decode.tokens"] == 6
    assert decode.attributes["txl.sampling.class"] == "top_k"
    assert decode.attributes["gen_ai.request.top_k"] == 5
    commit = named["session.commit"]
    assert commit.attributes["txl.session.version"] == 2
    assert commit.attributes["txl.persistence"] == "always"
    # Answered ahead of its blocks (write-behind): Redis holds the tokens it fed; the blocks are written after the
    # answer, in a trace of their own linked to this request's.
    assert commit.attributes["txl.commit.behind_tokens"] == usage["prompt_tokens"] + 6
    assert commit.attributes["txl.commit.blocks"] == 0 == commit.attributes["txl.commit.store_bytes"]
    assert not [s for s in trace if s.name == "blocks.write"]

    def written_behind(spans: list[ReceivedSpan]) -> bool:
        return any(s.name == "session.write_behind" and (trace_id, server.span_id) in s.links for s in spans)

    (behind,) = [
        s
        for s in receiver.wait_for(written_behind)
        if s.name == "session.write_behind" and (trace_id, server.span_id) in s.links
    ]
    assert behind.parent_span_id == "" and behind.start_ns >= server.end_ns
    assert behind.attributes["session.id"] == session["id"] and behind.attributes["txl.session.version"] == 2
    writes = trace_of_root(receiver, behind, "blocks.write")
    assert [s.name for s in writes] == ["blocks.write"]
    # In order: the lease, the fetch, then the engine's work, then the commit.
    assert named["session.lease"].end_ns <= named["session.fetch"].start_ns
    assert max(s.end_ns for s in prefill) <= decode.end_ns <= commit.start_ns
    assert_no_text(receiver.received())


def test_a_chained_responses_turn_is_one_trace_under_the_callers_trace(client, receiver):
    first = client.post("/v1/responses", json={"input": f"A {SECRET_TEXT}", "max_output_tokens": 4})
    assert first.status_code == 200
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    body = {
        "input": f" saw a {SECRET_TEXT}",
        "previous_response_id": first.json()["id"],
        "max_output_tokens": 5,
        "temperature": 0,
    }
    second = client.post("/v1/responses", json=body, headers={"traceparent": traceparent(trace_id)})
    assert second.status_code == 200
    response = second.json()
    session_id, _ = parse_response_id(response["id"])

    trace = trace_of(receiver, trace_id, *STAGES)
    server = server_span(trace)
    assert server.name == "POST /v1/responses"
    assert server.parent_span_id == "b7ad6b7169203331"
    attributes = server.attributes
    assert attributes["txl.request_id"] == second.headers["x-request-id"]
    assert attributes["gen_ai.response.id"] == response["id"]
    assert attributes["gen_ai.conversation.id"] == session_id == parse_response_id(first.json()["id"])[0]
    usage = response["usage"]
    assert attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"]
    assert (
        attributes["gen_ai.usage.cache_read.input_tokens"] == usage["input_tokens_details"]["cached_tokens"]
    )
    assert attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]
    assert_stages_under(trace, server)
    (decode,) = [s for s in trace if s.name == "engine.decode"]
    assert decode.attributes["txl.sampling.class"] == "greedy"
    assert_no_text(receiver.received())


def test_a_background_response_is_a_trace_linked_to_the_request_that_started_it(client, receiver):
    trace_id = "5cf92f3577b34da6a3ce929d0e0e4737"
    body = {"input": f"The {SECRET_TEXT}", "max_output_tokens": 4, "background": True}
    started = client.post("/v1/responses", json=body, headers={"traceparent": traceparent(trace_id)})
    assert started.status_code == 200
    response_id = started.json()["id"]
    deadline = time.monotonic() + 30
    while client.get(f"/v1/responses/{response_id}").json()["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.05)

    request = server_span(trace_of(receiver, trace_id))

    def linked(spans: list[ReceivedSpan]) -> bool:
        return any((trace_id, request.span_id) in s.links for s in spans)

    # (Its new session's first blocks are written behind it too, in a trace linked to it: session.write_behind.)
    (work,) = [
        s
        for s in receiver.wait_for(linked)
        if (trace_id, request.span_id) in s.links and s.name == "background response"
    ]
    assert work.trace_id != trace_id and work.parent_span_id == ""
    assert work.attributes["gen_ai.response.id"] == response_id
    assert work.attributes["txl.request_id"] == request.attributes["txl.request_id"]
    its = trace_of_root(receiver, work, "engine.decode", "session.commit")
    assert {"session.lease", "engine.decode", "session.commit"} <= {s.name for s in its}
    assert work.attributes["gen_ai.usage.output_tokens"] == 4
    assert_no_text(receiver.received())


def trace_of_root(receiver: OtlpReceiver, root: ReceivedSpan, *names: str) -> list[ReceivedSpan]:
    def complete(spans: list[ReceivedSpan]) -> bool:
        return all(any(s.trace_id == root.trace_id and s.name == n for s in spans) for n in names)

    return [s for s in receiver.wait_for(complete) if s.parent_span_id == root.span_id]


def test_every_answer_carries_a_request_id_and_the_json_log_names_it_with_the_trace(server, client, receiver):
    trace_id = "6af7651916cd43dd8448eb211c80319d"
    missing = client.get("/v1/sessions/nope", headers={"traceparent": traceparent(trace_id)})
    assert missing.status_code == 404 and len(missing.headers["x-request-id"]) == 32
    refused = client.post("/v1/sessions", json={"mem_len": -1}, headers={"X-Request-Id": "bad-input-1"})
    assert refused.status_code >= 400 and refused.headers["x-request-id"] == "bad-input-1"
    assert server_span(trace_of(receiver, trace_id)).attributes["http.response.status_code"] == 404
    session = client.post("/v1/sessions", json={"text": f"A {SECRET_TEXT}"}).json()
    step_trace = "7af7651916cd43dd8448eb211c80319e"
    headers = {"traceparent": traceparent(step_trace), "X-Request-Id": "log-step-1"}
    body = {"text": f" {SECRET_TEXT}", "max_tokens": 3, "stream": True}
    with client.stream("POST", f"/v1/sessions/{session['id']}/generate", json=body, headers=headers) as step:
        assert step.headers["x-request-id"] == "log-step-1"
        step.read()

    lines = [json.loads(line) for line in server.log().splitlines() if line.strip()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    (line,) = [a for a in access if a.get("request_id") == missing.headers["x-request-id"]]
    assert line["trace_id"] == trace_id and line["http"]["status"] == 404 and len(line["span_id"]) == 16
    assert len(line["tenant"]) == 32 and line["http"]["path"] == "/v1/sessions/nope"
    (line,) = [a for a in access if a.get("request_id") == "log-step-1"]
    assert line["trace_id"] == step_trace and line["session_id"] == session["id"]
    assert KEY not in server.log() and SECRET_TEXT not in server.log()


def test_a_conversation_turn_names_its_conversation_in_the_foreground_and_the_background(client, receiver):
    conversation = client.post("/v1/conversations", json={}).json()["id"]
    trace_id = "8af7651916cd43dd8448eb211c80319f"
    body = {"input": "The tide", "max_output_tokens": 3, "conversation": conversation}
    turn = client.post("/v1/responses", json=body, headers={"traceparent": traceparent(trace_id)})
    assert turn.status_code == 200
    request = server_span(trace_of(receiver, trace_id, "session.commit"))
    assert request.attributes["gen_ai.conversation.id"] == conversation
    assert request.attributes["gen_ai.response.id"] == turn.json()["id"]

    background_trace = "9af7651916cd43dd8448eb211c8031a0"
    later = {**body, "input": " came in", "background": True}
    started = client.post("/v1/responses", json=later, headers={"traceparent": traceparent(background_trace)})
    request = server_span(trace_of(receiver, background_trace))

    def done(spans: list[ReceivedSpan]) -> bool:
        roots = [s for s in spans if (background_trace, request.span_id) in s.links]
        return bool(roots) and any(
            s.name == "session.commit" and s.trace_id == roots[0].trace_id for s in spans
        )

    spans = receiver.wait_for(done)
    (work,) = [s for s in spans if (background_trace, request.span_id) in s.links]
    assert work.attributes["gen_ai.response.id"] == started.json()["id"]
    assert work.attributes["gen_ai.conversation.id"] == conversation  # not its session's id
