"""What the operator chooses of traces, through the standard variables and TXL_TRACE_TEXT: a sampler that keeps
nothing sends nothing (the request ids stay); prompt and generated text only when opted in; probes and scrapes
are never traced."""

from __future__ import annotations

import json

from txl_server.api.request_ids import RequestIds

from tests.helpers.live_server import LiveServer, live_settings

from .otlp_receiver import OtlpReceiver


def traced_server(
    monkeypatch, receiver: OtlpReceiver, tiny_model_dir, redis_server, **settings
) -> LiveServer:
    """A live server whose app read the OTEL_* variables set here (they are read when the app is made)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    options = {"model": tiny_model_dir, "redis_url": redis_server.url, **settings}
    return LiveServer(live_settings("trace-options", **options))


def test_with_trace_text_a_steps_span_holds_what_it_read_and_wrote(monkeypatch, tiny_model_dir, redis_server):
    with OtlpReceiver() as receiver:
        server = traced_server(monkeypatch, receiver, tiny_model_dir, redis_server, trace_text=True)
        with server, server.client() as client:
            assert client.get("/health").status_code == 200
            session = client.post("/v1/sessions", json={"text": "The heron"}).json()
            body = {"text": " waded", "max_tokens": 4, "temperature": 0}
            done = client.post(f"/v1/sessions/{session['id']}/generate", json=body).json()

        def found(spans):
            return any("gen_ai.output.messages" in s.attributes for s in spans)

        spans = receiver.wait_for(found)
    (step,) = [s for s in spans if "gen_ai.output.messages" in s.attributes]
    assert step.name == "POST /v1/sessions/{session_id}/generate"
    read = json.loads(step.attributes["gen_ai.input.messages"])
    wrote = json.loads(step.attributes["gen_ai.output.messages"])
    assert read == [{"role": "user", "parts": [{"type": "text", "content": " waded"}]}]
    assert wrote == [{"role": "assistant", "parts": [{"type": "text", "content": done["text"]}]}]
    assert not [s for s in spans if s.attributes.get("url.path") in ("/health", "/ready", "/metrics")]


def test_a_sampler_that_keeps_nothing_sends_nothing(monkeypatch, tiny_model_dir, redis_server):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    with OtlpReceiver() as receiver:
        server = traced_server(monkeypatch, receiver, tiny_model_dir, redis_server)
        with server, server.client() as client:
            session = client.post("/v1/sessions", json={"text": "The heron"})
            headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
            step = client.post(
                f"/v1/sessions/{session.json()['id']}/generate", json={"max_tokens": 3}, headers=headers
            )
        # The server stopped: its spans, had it kept any, were sent at shutdown.
        (layer,) = [m for m in server.app.user_middleware if m.cls is RequestIds]
        assert layer.kwargs["tracing"] is not None  # it traced, and its sampler kept nothing
        assert session.headers["x-request-id"] and step.headers["x-request-id"]
        assert step.status_code == 200
        assert receiver.received() == []
