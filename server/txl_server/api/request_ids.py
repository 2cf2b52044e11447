"""The outermost layer: every HTTP request gets an id (the caller's `X-Request-Id`, kept if it is sane, else a
new one), returned on every answer, errors and streams included, and named in every log line logged while
serving it; when the app traces, the request is a server span continuing the caller's `traceparent`.

The server span carries the HTTP attributes of OpenTelemetry's conventions (`http.request.method`, `url.path`,
`http.route`, `http.response.status_code`, ...); it ends when the answer's last byte is sent, so a stream's span
lasts as long as the stream. Only 5xx answers mark it an error: a 4xx is the caller's. Probes and scrapes
(`UNTRACED`) are not traced: every pod's kubelet and Prometheus would fill the traces with them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..telemetry.context import (
    REQUEST_ID_HEADER,
    RequestContext,
    accepted_request_id,
    caller_trace_id,
    carrying,
    enter,
    new_request_id,
)
from ..telemetry.tracing import Tracing

_HEADER = REQUEST_ID_HEADER.lower().encode()
UNTRACED = frozenset({"/health", "/ready", "/metrics"})


def request_id_of(scope: Scope) -> str | None:
    """The id this layer gave the request (for an answer sent from outside it: Starlette's last-resort 500)."""
    context = scope.get("state", {}).get("txl_request")
    return context.request_id if isinstance(context, RequestContext) else None


class RequestIds:
    def __init__(self, app: ASGIApp, tracing: Tracing | None) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        context = RequestContext(accepted_request_id(headers.get("x-request-id")) or new_request_id())
        scope.setdefault("state", {})["txl_request"] = context
        enter(context)
        header = (_HEADER, context.request_id.encode())
        status = 0

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        if self.tracing is None or scope["path"] in UNTRACED:
            context.caller_trace_id = caller_trace_id(headers.get("traceparent"))
            await self.app(scope, receive, answer)
            return
        from opentelemetry import context as otel_context
        from opentelemetry import propagate, trace

        parent = propagate.extract(headers)
        method = scope.get("method", "GET")
        span = self.tracing.tracer.start_span(
            method, context=parent, kind=trace.SpanKind.SERVER, attributes=_attributes(scope, headers)
        )
        span.set_attribute("txl.request_id", context.request_id)
        context.tracing = self.tracing
        if span.is_recording():
            context.root = span
        else:  # not sampled: nothing more is drawn, but its lines name the trace
            context.caller_trace_id = trace.format_trace_id(span.get_span_context().trace_id)
        # The span's context continues the caller's trace, and carries the request (its log lines name it).
        token = otel_context.attach(trace.set_span_in_context(span, carrying(context, parent)))
        try:
            await self.app(scope, receive, answer)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            span.record_exception(exc)
            status = status or 500  # answered from outside this layer (Starlette's last-resort 500)
            raise
        finally:
            template = getattr(scope.get("route"), "path", None)
            if template:
                span.set_attribute("http.route", template)
                span.update_name(f"{method} {template}")
            if status:
                span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_attribute("error.type", str(status))
                span.set_status(trace.StatusCode.ERROR)
            span.end()
            otel_context.detach(token)


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (the last of repeated ones)."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", ())}


def _attributes(scope: Scope, headers: dict[str, str]) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "http.request.method": scope.get("method", "GET"),
        "url.path": scope.get("path", ""),
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
    }
    if server := scope.get("server"):
        attributes["server.address"], attributes["server.port"] = server[0], server[1]
    if client := scope.get("client"):
        attributes["client.address"] = client[0]
    if agent := headers.get("user-agent"):
        attributes["user_agent.original"] = agent[:256]
    return attributes
