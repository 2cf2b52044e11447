"""Server-sent events as the tests read them: the `data:` payloads of a stream, in order."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import httpx

DONE = "[DONE]"


def sse_payloads(lines: Iterable[str]) -> list[Any]:
    """`data:` payloads of an SSE stream's lines: parsed JSON, or the string "[DONE]"."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == DONE else json.loads(data))
    return out


def sse_events(response: httpx.Response) -> list[Any]:
    """The payloads of a streamed response, read to its end."""
    return sse_payloads(response.iter_lines())
