"""Log lines: JSON (one object per line, the request's fields while serving one) and text (as before, the request
id at the end), uvicorn's access lines in the same format; without tracing, the caller's trace id from its
traceparent still names the request's lines. The request rides in OpenTelemetry's context, through the contexts
that spans put in its place."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import sys

import httpx
import pytest
from opentelemetry import context as otel_context
from opentelemetry import propagate
from starlette.responses import PlainTextResponse
from txl_server.api.request_ids import RequestIds
from txl_server.telemetry.context import RequestContext, carrying, current, enter
from txl_server.telemetry.logs import JsonFormatter, TextFormatter, configure_logging


def record(
    name: str = "txl_server", message: str = "hello %s", args: tuple = ("world",), exc_info=None
) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, message, args, exc_info)


def in_request(context: RequestContext, function):
    """`function()` run as the request `context` would run it (a context of its own)."""

    def run():
        enter(context)
        return function()

    return contextvars.copy_context().run(run)


def test_the_request_rides_in_opentelemetrys_context_through_a_span_that_replaces_it():
    context = RequestContext("req-carried")

    def run():
        enter(context)
        seen = [current()]
        # A server span continuing the caller's trace starts from a context of its own (the extracted one).
        parent = propagate.extract({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
        token = otel_context.attach(carrying(context, parent))
        seen.append(current())
        otel_context.detach(token)
        seen.append(current())  # after the span: still the request's (its last lines name it)
        otel_context.attach(parent)
        seen.append(current())  # what a context built without `carrying` would lose
        return seen

    assert contextvars.copy_context().run(run) == [context, context, context, None]
    assert current() is None  # the request's alone: nothing outside it sees it


def test_a_json_line_outside_a_request_has_the_base_fields_only():
    line = json.loads(JsonFormatter().format(record()))
    assert line.keys() == {"time", "level", "logger", "message"}
    assert line["level"] == "warning" and line["message"] == "hello world" and line["logger"] == "txl_server"
    assert line["time"].endswith("+00:00") and "T" in line["time"]


def test_a_json_line_in_a_request_names_it_its_session_and_tenant():
    context = RequestContext("req-1", caller_trace_id="4bf92f3577b34da6a3ce929d0e0e4736")
    context.session_id, context.tenant = "sess-9", "a" * 32
    line = json.loads(in_request(context, lambda: JsonFormatter().format(record())))
    assert line["request_id"] == "req-1" and line["session_id"] == "sess-9" and line["tenant"] == "a" * 32
    assert line["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736" and "span_id" not in line


def test_a_json_access_line_has_its_http_fields_and_an_error_its_traceback():
    access = record(
        "uvicorn.access", '%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5000", "GET", "/v1/models?x=1", "1.1", 200)
    )
    line = json.loads(JsonFormatter().format(access))
    assert line["http"] == {
        "method": "GET",
        "path": "/v1/models?x=1",
        "status": 200,
        "client": "127.0.0.1:5000",
    }
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        failed = record(exc_info=sys.exc_info())
    text = JsonFormatter().format(failed)
    assert "\n" not in text  # one line, whatever the message
    assert "ValueError: boom" in json.loads(text)["exception"]


def test_a_text_line_ends_with_the_request_id_while_serving_one():
    formatter = TextFormatter("%(levelname)s %(name)s: %(message)s")
    assert formatter.format(record()) == "WARNING txl_server: hello world"
    inside = in_request(RequestContext("req-2"), lambda: formatter.format(record()))
    assert inside == "WARNING txl_server: hello world [request req-2]"


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_the_configuration_sends_the_apps_and_uvicorns_lines_in_one_format(log_format, monkeypatch):
    stderr, stdout = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(sys, "stdout", stdout)
    saved = {name: logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.access", "uvicorn.error")}
    state = {name: (lg.handlers[:], lg.level, lg.propagate) for name, lg in saved.items()}
    try:
        logging.getLogger().handlers[:] = []  # a process that has configured nothing yet
        configure_logging(log_format, "info")
        logging.getLogger("txl_server.test").info("from the app")
        logging.getLogger("uvicorn.error").info("from uvicorn")
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "GET", "/health", "1.1", 200
        )
        logging.getLogger("txl_server.test").debug("below the level")
    finally:
        for name, (handlers, level, propagate) in state.items():
            saved[name].handlers[:], saved[name].level, saved[name].propagate = handlers, level, propagate
    lines = stderr.getvalue().splitlines()
    if log_format == "json":
        parsed = [json.loads(line) for line in lines]
        assert [p["logger"] for p in parsed] == ["txl_server.test", "uvicorn.error", "uvicorn.access"]
        assert parsed[2]["http"]["path"] == "/health" and stdout.getvalue() == ""
    else:  # uvicorn's access lines go to stdout in text, as uvicorn has them
        assert len(lines) == 2 and lines[0].endswith("INFO txl_server.test: from the app")
        assert "from uvicorn" in lines[1] and '"GET /health HTTP/1.1" 200' in stdout.getvalue()


def test_an_existing_root_handler_is_kept_as_basic_config_keeps_it(monkeypatch):
    """An embedding program's (or a test's) handler on the root logger stays, and nothing is added beside it."""
    root = logging.getLogger()
    kept = logging.StreamHandler(io.StringIO())
    saved = (root.handlers[:], root.level)
    try:
        root.handlers[:] = [kept]
        configure_logging("json", "info")
        assert root.handlers == [kept]
    finally:
        root.handlers[:], root.level = saved


async def test_without_tracing_a_requests_lines_carry_the_callers_trace_id():
    """The request-id layer alone (no tracer): a line logged inside the request carries its id and the trace id
    of the caller's traceparent."""
    formatted: list[str] = []

    async def app(scope, receive, send):
        formatted.append(JsonFormatter().format(record()))
        await PlainTextResponse("ok")(scope, receive, send)

    transport = httpx.ASGITransport(app=RequestIds(app, tracing=None))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        headers = {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "X-Request-Id": "r-1",
        }
        answer = await client.get("/", headers=headers)
        bad = await client.get("/", headers={"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"})
    assert answer.headers["x-request-id"] == "r-1"
    first, second = (json.loads(line) for line in formatted)
    assert first["request_id"] == "r-1" and first["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert second["request_id"] == bad.headers["x-request-id"] and "trace_id" not in second  # an invalid one
