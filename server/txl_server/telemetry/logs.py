"""Log lines for a terminal (the default) or for a machine (TXL_LOG_FORMAT=json), uvicorn's included.

JSON: one object per line, with `time` (UTC, ISO 8601), `level`, `logger`, `message`, and, for a line logged while
serving a request, `request_id`, `trace_id` and `span_id` (when traced; without tracing, the caller's trace id
from its traceparent), `session_id` and `tenant` (an API key's digest prefix: the key itself is never logged);
`exception` holds a traceback; uvicorn's access lines add `http` (method, path, status, client). Text: the lines
as before, with the request id at the end of a line logged while serving a request.

The fields are read when a line is formatted, on the thread and in the task that logs it: the request's context
(context.py) is there.
"""

from __future__ import annotations

import json
import logging
import logging.config
import sys
from datetime import UTC, datetime
from typing import Any

from uvicorn.logging import AccessFormatter

from .context import current

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_FORMAT = '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'


def request_fields() -> dict[str, str]:
    """The request's fields for a line logged now: empty outside a request."""
    context = current()
    if context is None:
        return {}
    fields = {"request_id": context.request_id}
    if context.root is not None:
        from opentelemetry import trace

        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            fields["trace_id"] = trace.format_trace_id(span.trace_id)
            fields["span_id"] = trace.format_span_id(span.span_id)
    elif context.caller_trace_id is not None:
        fields["trace_id"] = context.caller_trace_id
    if context.session_id is not None:
        fields["session_id"] = context.session_id
    if context.tenant is not None:
        fields["tenant"] = context.tenant
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **request_fields(),
        }
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, _, status = record.args
            line["http"] = {"method": method, "path": path, "status": status, "client": client}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _with_request_id(text: str) -> str:
    context = current()
    return text if context is None else f"{text} [request {context.request_id}]"


class TextFormatter(logging.Formatter):
    """The text format, with the request's id at the end of a line logged while serving it."""

    def format(self, record: logging.LogRecord) -> str:
        return _with_request_id(super().format(record))


class TextAccessFormatter(AccessFormatter):
    """uvicorn's access line, with the request's id at its end."""

    def format(self, record: logging.LogRecord) -> str:
        return _with_request_id(super().format(record))


def log_config(log_format: str, level: str) -> dict[str, Any]:
    """uvicorn's loggers as a `logging.config.dictConfig` (uvicorn applies it when it starts): to stderr, except
    its access lines in text (stdout, as uvicorn has them). The root logger, which the server's own loggers and
    the libraries' reach, is `configure_logging`'s."""
    level = level.upper()
    if log_format == "json":
        formatters: dict[str, Any] = {n: {"()": JsonFormatter} for n in ("uvicorn", "access")}
        access_stream = "ext://sys.stderr"  # one stream of lines to collect
    else:
        formatters = {
            "uvicorn": {"()": "uvicorn.logging.DefaultFormatter", "fmt": "%(levelprefix)s %(message)s"},
            "access": {"()": TextAccessFormatter, "fmt": ACCESS_FORMAT},
        }
        access_stream = "ext://sys.stdout"
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": formatters,
        "handlers": {
            "uvicorn": {**handler, "formatter": "uvicorn"},
            "access": {**handler, "formatter": "access", "stream": access_stream},
        },
        "loggers": {
            "uvicorn": {"handlers": ["uvicorn"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["access"], "level": level, "propagate": False},
        },
    }


def configure_logging(log_format: str, level: str) -> None:
    """The process's logging, from the start: the root logger as `logging.basicConfig` would set it (nothing
    if it has a handler already: an embedding program's, a test's), in the chosen format; then uvicorn's."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
        root.addHandler(handler)
        root.setLevel(level.upper())
    logging.config.dictConfig(log_config(log_format, level))
