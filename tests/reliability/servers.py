"""What the reliability suite's tests share besides their servers (tests/helpers/server_process.py): a model's
session sizes, the error shape, token-exact streams, percentiles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from txl import peak_positions

from tests.helpers.server_process import REPO
from tests.helpers.sse import sse_payloads

BUNDLED_MODEL = REPO / "server" / "txl_server" / "default_model"


# ---------------------------------------------------------------------------------------------- models


def session_bytes(model_dir: Path) -> tuple[int, int]:
    """(bytes of a working session on the device at its largest, bytes of a full compacted one) for a model
    directory. A session fed whole segments keeps headroom for a few more, so a working session costs more than
    its `mem_len + tgt_len` positions: budgets sized from the latter fill up with fewer sessions than expected."""
    config = json.loads((model_dir / "config.json").read_text())
    d_head = config.get("d_head") or config["d_model"] // config["n_head"]
    per_position = config["n_layer"] * 2 * config["n_head"] * d_head * 4  # float32 keys and values
    hidden = config["d_model"] * 4
    working = peak_positions(config["mem_len"], config["tgt_len"]) * per_position + hidden
    return working, config["mem_len"] * per_position + hidden


# ---------------------------------------------------------------------------------------------- responses


OPENAI_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models")


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The error object of a response in the one error shape (asserting the shape); on the OpenAI routes, in
    OpenAI's shape, which adds `code` (docs/api.md)."""
    body = response.json()
    url = getattr(response, "url", None) or response.request.url  # httpx, requests, or schemathesis' own
    openai = urlsplit(str(url)).path in OPENAI_ROUTES
    shape = {"type", "message", "param"} | ({"code"} if openai else set())
    # The native shape may carry a `code` too, where one helps (version_not_found, server_shutting_down).
    assert set(body) == {"error"} and set(body["error"]) - {"code"} == shape - {"code"}, body
    return dict(body["error"])


# `type` of an invalid request on the OpenAI routes (elsewhere: "invalid_request").
OPENAI_INVALID = "invalid_request_error"


def stream_tokens(
    client: httpx.Client, session_id: str, headers: dict[str, str] | None = None, **body: Any
) -> tuple[list[int], dict[str, Any]]:
    """Generates with stream=true; returns the token ids and the final `done` event (token-exact comparisons)."""
    request = {"max_tokens": 16, "temperature": 0, **body, "stream": True}
    with client.stream(
        "POST", f"/v1/sessions/{session_id}/generate", json=request, headers=headers
    ) as response:
        assert response.status_code == 200, response.read().decode()
        events = sse_payloads(list(response.iter_lines()))
    assert events[-1] == "[DONE]" and events[-2]["type"] == "done", events[-3:]
    return [e["token"]["id"] for e in events[:-2] if e["type"] == "token"], events[-2]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
