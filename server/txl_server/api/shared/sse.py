"""Server-sent events: `data: <json>` lines, ending with `data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"
# Proxies (nginx) must not buffer a stream.
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# Characters some SSE/line readers take as line breaks (httpx's iter_lines does): escaped so an event is one line.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def event(payload: Any) -> str:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKS)
    return f"data: {data}\n\n"


def error_event(error: dict[str, Any]) -> str:
    """An error in a stream: the event's shape is read by both kinds of stream reader: ours (`type` "error") and
    OpenAI's clients (an `error` key)."""
    return event({"type": "error", "error": error})


def error_end(error: dict[str, Any]) -> str:
    """The end of a stream cut short: an `error` event, then `[DONE]`."""
    return error_event(error) + DONE
