"""A stored turn against a stateless request: what keeping a session costs, end to end and to the first token.

One server process (bundled model, persistence `always`: every commit is in Redis before the answer ends, with the
token ids the step fed; its memory blocks are written to the block store 50 ms after the answer: write-behind,
docs/server.md), greedy decoding, streamed. First turns: a `/v1/responses` request that
stores its session (`store` true, the default) against a stateless `/v1/completions` request of the same text,
each text new to the prefix cache. Chained turns: a 30-turn conversation of ~170-byte messages and one-token
replies, each turn a `/v1/responses` request chained with `previous_response_id` (the server feeds only the new
message, then commits the session), against the same transcript resent whole to `/v1/completions`, which the
prefix cache serves up to its last boundary (nothing is committed). Each turn's two requests are sent one after
the other; the conversation is repeated and the medians per turn reported, so that a slow spell of the machine
falls on both kinds alike. Each request is sent once the server is idle again (PAUSE after the last answer), so
that work one leaves behind (a chained turn's blocks, written after its answer) is not timed as part of the next.
Time to first token: the first text delta on the stream; end to end: until `[DONE]`.
"""

from __future__ import annotations

import json
import statistics
import time

import httpx
from txl_server.check.benchmark_docs import Section

from .http import Server
from .responses import message

TURNS = 30
RUNS = 9  # conversations: each turn's medians over this many (the machine's noise is a few ms at a turn)
PAUSE = 0.1  # seconds between requests: what a request leaves behind (blocks written behind) is done by then


def streamed(http: httpx.Client, path: str, body: dict, marker: str) -> tuple[float, float, list[str]]:
    """(seconds to the first line holding `marker`, seconds to the end, the lines) of a streamed request, sent
    once the server is idle (PAUSE)."""
    time.sleep(PAUSE)
    started = time.perf_counter()
    first = None
    lines = []
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and marker in line:
                first = time.perf_counter() - started
            lines.append(line)
    if first is None:
        raise RuntimeError(f"{path} streamed no text")
    return first, time.perf_counter() - started, lines


def stateless(http: httpx.Client, text: str) -> tuple[float, float]:
    body = {"prompt": text, "max_tokens": 1, "temperature": 0}
    return streamed(http, "/v1/completions", body, '"text":')[:2]


def response(http: httpx.Client, text: str, previous: str | None) -> tuple[float, float, str, str]:
    """A Responses turn: (first token s, end s, its id, its reply)."""
    body = {"input": text, "max_output_tokens": 1, "temperature": 0}
    if previous is not None:
        body["previous_response_id"] = previous
    first, end, lines = streamed(http, "/v1/responses", body, "output_text.delta")
    done = json.loads(next(line for line in reversed(lines) if line.startswith("data: {"))[6:])
    reply = done["response"]["output"][0]["content"][0]["text"]
    return first, end, done["response"]["id"], reply


def first_turns(http: httpx.Client, rounds: int) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {"stateless": [], "stored": []}
    text = "It was the best of times, it was the worst of times, it was the age of wisdom. " * 4
    for i in range(rounds):  # texts of one length, each new to the prefix cache
        out["stateless"].append(stateless(http, f"[{i}c] {text}"))
        out["stored"].append(response(http, f"[{i}s] {text}", None)[:2])
    return out


def conversation(http: httpx.Client, tag: int) -> list[tuple[float, float, float, float]]:
    """Per turn: chained (first, end), then resent (first, end)."""
    rows, previous, history = [], None, ""
    for turn in range(TURNS):
        text = (f"[{tag}]" if turn == 0 else "") + message(turn)
        first, end, previous, reply = response(http, text, previous)
        history += text
        r_first, r_end = stateless(http, history)
        history += reply
        rows.append((first, end, r_first, r_end))
    return rows


def run(quick: bool = False) -> Section:
    section = Section("chained", "A stored turn against a stateless request", "python -m bench chained")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    server = Server(None, {"TXL_PERSISTENCE": "always"})
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            stateless(http, "warm up " * 20)
            firsts = first_turns(http, 5 if quick else 15)
            runs = [conversation(http, tag) for tag in range(2 if quick else RUNS)]
    finally:
        server.stop()

    def median_ms(values: list[float]) -> float:
        return statistics.median(values) * 1000

    kinds = {"stateless": "stateless (/v1/completions)", "stored": "first stored turn (/v1/responses)"}
    base = firsts["stateless"]
    section.table(
        "first turn: a new session stored, against a stateless request of the same text (medians, ms)",
        ["request", "first token", "end to end", "x stateless (first token)", "x stateless (end)"],
        [
            [
                kinds[kind],
                median_ms([r[0] for r in rows]),
                median_ms([r[1] for r in rows]),
                median_ms([r[0] for r in rows]) / median_ms([r[0] for r in base]),
                median_ms([r[1] for r in rows]) / median_ms([r[1] for r in base]),
            ]
            for kind, rows in firsts.items()
        ],
    )
    per_turn = [[run[turn] for run in runs] for turn in range(TURNS)]
    medians = [[statistics.median(v[k] for v in values) for k in range(4)] for values in per_turn]
    shown = [1, 2, 5, 10, 15, 20, 25, 30]
    section.table(
        "chained turns against the transcript resent through the prefix cache (medians over the runs, ms)",
        ["turn", "chained: first token", "resent: first token", "chained: end to end", "resent: end to end"],
        [
            [
                t,
                medians[t - 1][0] * 1000,
                medians[t - 1][2] * 1000,
                medians[t - 1][1] * 1000,
                medians[t - 1][3] * 1000,
            ]
            for t in shown
        ],
    )
    later = medians[1:]
    not_dearer = sum(1 for m in later if m[1] <= m[3])
    dearer = [
        f"{t} (+{(m[1] - m[3]) * 1000:.1f} ms)" for t, m in enumerate(medians, 1) if t > 1 and m[1] > m[3]
    ]
    closest = max(range(2, TURNS + 1), key=lambda t: medians[t - 1][1] - medians[t - 1][3])
    gap = (medians[closest - 1][1] - medians[closest - 1][3]) * 1000
    section.note(
        f"Turns 2 to {TURNS}: the chained turn ended no later than the resent one at {not_dearer} of {len(later)} "
        f"turns ({'later at turns ' + ', '.join(dearer) if dearer else 'every one'}; the closest, turn {closest}: "
        f"chained {gap:+.1f} ms against the resend); medians over those turns: chained {statistics.median(m[1] for m in later) * 1000:.1f} ms end to "
        f"end ({statistics.median(m[0] for m in later) * 1000:.1f} ms to the first token), resent "
        f"{statistics.median(m[3] for m in later) * 1000:.1f} ms ({statistics.median(m[2] for m in later) * 1000:.1f}"
        " ms). Targets: a first stored turn within 1.25x a stateless request, end to end and to the first token; a "
        "chained turn no slower than the resend at every turn from 2 to 30."
    )
    return section
