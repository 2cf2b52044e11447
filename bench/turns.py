"""Time to first token, turn by turn, in a long chat: chained on the server's memory against resending the history.

A 40-turn conversation on the bundled model over real HTTP (server processes, greedy decoding): each turn adds a
~480-byte user message and a 32-token reply, so the history reaches ~20,000 tokens. Chained, each turn is a
`/v1/responses` request with `previous_response_id`: the server continues the previous turn's memory and feeds
only the new message. Resent, each turn is a stateless `/v1/completions` request carrying the whole history, as
every other server is used: with the prefix cache (on by default) the server finds the history's beginning it
read on the previous turn; without it (`TXL_PREFIX_CACHE_BYTES=0`) it reads the whole history again. Time to first
token is measured client-side on the stream (the first text delta), the faster of two rounds per turn. Resending
without the cache costs time in proportion to the history, so it is measured on every fifth turn (each such
request stands alone: it depends only on the history it carries; the second round sends them last turn first).
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from txl_server.check.benchmark_docs import Section

from .http import Server
from .responses import message as sentence

TURNS, OUTPUT_TOKENS = 40, 32
SHOWN = (1, 10, 20, 40)  # the turns the table gives
SERIES = ("chained", "resent", "resent_uncached")  # seconds to first token


def message(turn: int) -> str:
    return "".join(sentence(3 * turn + k) for k in range(3))


def first_token(http: httpx.Client, path: str, body: dict, marker: bytes) -> tuple[float, list[bytes]]:
    """Seconds to the first line holding `marker` of a streamed request, and all its lines."""
    started = time.perf_counter()
    seconds = None
    lines = []
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if seconds is None and marker in line.encode():
                seconds = time.perf_counter() - started
            lines.append(line.encode())
    if seconds is None:
        raise RuntimeError(f"{path} streamed no token")
    return seconds, lines


def chained_turns(http: httpx.Client, turns: int, message_of: Callable[[int], str] = message) -> list[dict]:
    """Each turn chained with previous_response_id: its time to first token, reply and the history's tokens."""
    rows, previous, history = [], None, ""
    for turn in range(turns):
        text = message_of(turn)
        body = {"input": text, "max_output_tokens": OUTPUT_TOKENS, "temperature": 0}
        if previous is not None:
            body["previous_response_id"] = previous
        seconds, lines = first_token(http, "/v1/responses", body, b'"response.output_text.delta"')
        # The last event holds the response (completed, or incomplete at max_output_tokens).
        done = _json(next(line for line in reversed(lines) if line.startswith(b"data: {")))
        reply = done["response"]["output"][0]["content"][0]["text"]
        history += text
        tokens = http.post("/tokenize", json={"prompt": history}).json()["count"]
        rows.append({"history": history, "chained": seconds, "tokens": tokens})
        history += reply
        previous = done["response"]["id"]
    return rows


def resent_turn(http: httpx.Client, history: str) -> float:
    """Seconds to the first token of the whole history sent to /v1/completions."""
    body = {"prompt": history, "max_tokens": 1, "temperature": 0}
    seconds, _ = first_token(http, "/v1/completions", body, b'"text":')
    return seconds


def _json(line: bytes) -> dict:
    return json.loads(line.decode().removeprefix("data: "))


def measure(
    turns: int, every: int, message_of: Callable[[int], str] = message, *, backwards: bool = False
) -> list[dict]:
    """Per turn: the history's tokens, and seconds to first token chained, resent with the prefix cache, and
    (every `every` turns, and the last) resent without it; `backwards` sends those last ones from the last turn
    to the first, so that a slow spell of the machine falls on other turns than in a forward round."""
    cached = Server(None)
    try:
        with httpx.Client(base_url=cached.url, timeout=900) as http:
            http.post("/v1/responses", json={"input": "Warm-up.", "max_output_tokens": 2})
            rows = chained_turns(http, turns, message_of)
            for row in rows:
                row["resent"] = resent_turn(http, row["history"])
    finally:
        cached.stop()
    uncached = Server(None, {"TXL_PREFIX_CACHE_BYTES": "0"})
    try:
        with httpx.Client(base_url=uncached.url, timeout=900) as http:
            http.post("/v1/completions", json={"prompt": "Warm-up.", "max_tokens": 1})
            sampled = [row for n, row in enumerate(rows, start=1) if n == 1 or n % every == 0 or n == turns]
            for row in reversed(sampled) if backwards else sampled:
                row["resent_uncached"] = resent_turn(http, row["history"])
    finally:
        uncached.stop()
    return rows


def fastest(rounds: list[list[dict]]) -> list[dict]:
    """Per turn, the faster of the rounds in each series: the machine's slow spells are not the server's."""
    if any([r["history"] for r in other] != [r["history"] for r in rounds[0]] for other in rounds[1:]):
        raise RuntimeError("greedy replies differed between rounds: their times are not of the same turns")
    return [
        {key: min(r[key] for r in same) if key in SERIES else value for key, value in same[0].items()}
        for same in zip(*rounds, strict=True)
    ]


def plot(rows: list[dict], path: Path) -> None:
    """Time to first token per turn, one line per way of sending the turn (the house style of
    txl.training.figures)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    turns = list(range(1, len(rows) + 1))
    ax.plot(turns, [r["chained"] for r in rows], "o-", markersize=3, label="chained (previous_response_id)")
    ax.plot(turns, [r["resent"] for r in rows], "s-", markersize=3, label="history resent, prefix cache on")
    sampled = [(t, r["resent_uncached"]) for t, r in zip(turns, rows, strict=True) if "resent_uncached" in r]
    ax.plot(*zip(*sampled, strict=True), "^-", markersize=4, label="history resent, prefix cache off")
    ax.set_xlabel("turn (a ~480-byte message and a 32-token reply each)")
    ax.set_ylabel("time to first token, s (log scale)")
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ticks = [t for t in (0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if low <= t <= high]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])  # plain seconds, not powers of ten
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(quick: bool = False) -> Section:
    section = Section("turns", "Time to first token in a long chat", "python -m bench turns")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    turns, every = (6, 3) if quick else (TURNS, 5)
    rows = fastest([measure(turns, every, backwards=bool(i)) for i in range(1 if quick else 2)])
    shown = [t for t in SHOWN if t <= turns] or [turns]
    section.table(
        f"bundled model, {turns} turns, time to first token (ms) at turns {', '.join(map(str, shown))}",
        ["turn", "history tokens", "chained", "resent, prefix cache on", "resent, prefix cache off"],
        [
            [
                t,
                rows[t - 1]["tokens"],
                1000 * rows[t - 1]["chained"],
                1000 * rows[t - 1]["resent"],
                1000 * rows[t - 1].get("resent_uncached", float("nan")),
            ]
            for t in shown
        ],
    )
    last = rows[-1]
    section.note(
        f"At turn {turns} ({last['tokens']:,} tokens of history) the first token came after "
        f"{1000 * last['chained']:.0f} ms chained, {1000 * last['resent']:.0f} ms resent with the prefix cache "
        f"and {1000 * last['resent_uncached']:.0f} ms resent without it "
        f"({last['resent_uncached'] / last['chained']:.0f}x the chained turn). Times are client-side on a machine "
        "shared with other work: the trend is the point."
    )
    section.note(
        f"Chained, turn {turns} took {last['chained'] / rows[0]['chained']:.1f}x turn 1's time to first token: the "
        "session's memory holds the conversation, and only the new message is read. Resent with the prefix cache "
        "on, the server starts from the Transformer-XL state it kept at the last segment boundary the history "
        "shares with the previous turn's prompt, so it too reads little more than the new message; but the client "
        "still sends, and the server still tokenizes and hashes, the whole history each turn, and the cache is a "
        "bounded budget that other traffic evicts. Without it the whole history is read again, as on any server "
        "that keeps no state between requests."
    )
    if importlib.util.find_spec("matplotlib") is not None:  # the `train` extra; without it, no figure
        section.figure("turns.png", lambda path: plot(rows, path))
    return section
