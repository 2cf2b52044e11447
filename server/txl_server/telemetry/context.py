"""What is known of the request being served, wherever its code runs: its id, its tenant and session, and (when
tracing is on) its trace. The request-id middleware (api/request_ids.py) makes one per HTTP request; log lines and
spans read it.

It rides in OpenTelemetry's context, the standard carrier of what belongs to a request, which the spans ride in
too (a variable of ours would be a second, hidden one): it is the request's, not the code's. Every task the request
starts (a stream, a long work's task, several completions' pumps) copies that context and shares the one object,
so what a later step learns (the session, the tenant) shows in every line logged after it. A background
response's work gets a context of its own, linked to the request that started it (spans.py: `linked`). Whatever
replaces the current OpenTelemetry context (a server span continuing the caller's trace, a background response's
new trace) builds it with `carrying`, so that the request goes with it.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .tracing import Tracing

REQUEST_ID_HEADER = "X-Request-Id"
# A caller's id is kept if it is 1 to 128 visible ASCII characters (a UUID, a ULID, a gateway's id); anything else
# (too long, spaces, control characters) is replaced by one of ours rather than refused: the id is for finding
# the request, never a reason to fail it.
_ACCEPTED_ID = re.compile(r"[!-~]{1,128}")
# W3C traceparent: version-traceid-parentid-flags. Its trace id is logged even while this server does not trace,
# so that its log lines are found under the caller's trace.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


def new_request_id() -> str:
    """32 hex characters (128 random bits)."""
    return secrets.token_hex(16)


def accepted_request_id(value: str | None) -> str | None:
    """The caller's X-Request-Id if it is kept (else None: the request gets a new one)."""
    if value is None or not _ACCEPTED_ID.fullmatch(value):
        return None
    return value


def caller_trace_id(traceparent: str | None) -> str | None:
    """The trace id of a valid W3C traceparent (not all zeros), else None."""
    match = _TRACEPARENT.fullmatch(traceparent.strip()) if traceparent else None
    if match is None or match.group(1) == "0" * 32:
        return None
    return match.group(1)


@dataclass
class RequestContext:
    request_id: str
    tracing: Tracing | None = None  # None: this server does not trace
    # The request's server span (a background response's own span), when traced and sampled: None, no span is
    # drawn for it.
    root: Span | None = None
    caller_trace_id: str | None = None  # from the caller's traceparent, logged when not traced
    tenant: str | None = None
    session_id: str | None = None
    conversation_id: str | None = None  # named by the request (a conversation's); else its session's
    # What the request's steps read and wrote, summed (gen_ai.usage.*).
    input_tokens: int = 0
    output_tokens: int = 0

    def annotate(self, attributes: dict[str, Any]) -> None:
        """Sets `attributes` on the request's span, if it is traced."""
        if self.root is not None:
            self.root.set_attributes(attributes)


_REQUEST = otel_context.create_key("txl.request")


def current() -> RequestContext | None:
    """The request being served here, if any (None on the worker's thread, at start-up, in tests of parts)."""
    context = otel_context.get_value(_REQUEST)
    return context if isinstance(context, RequestContext) else None


def carrying(context: RequestContext, carrier: otel_context.Context | None = None) -> otel_context.Context:
    """`carrier` (default: the current OpenTelemetry context) with `context` as its request."""
    return otel_context.set_value(_REQUEST, context, carrier)


def enter(context: RequestContext) -> None:
    """Makes `context` the request of this task (and of the tasks it starts from now on). Never detached: each
    request runs in a task of its own, and a background response's work in another; the lines logged after its
    answer (an error the server reports once the application has raised) still name it."""
    otel_context.attach(carrying(context))


def bind_tenant(tenant: str) -> None:
    """The request's tenant (an API key's digest prefix, never the key), for its log lines and its span."""
    context = current()
    if context is not None:
        context.tenant = tenant
        context.annotate({"txl.tenant": tenant})
