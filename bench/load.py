"""Overload: what a crowd gets from the bundled model's server, before admission control (the tree at BEFORE) and
now, each scenario run on both, one after the other, in one run on one machine.

Clients stream `/v1/completions` (prompts of 128 bytes new to the prefix cache, 64 tokens out), over raw sockets
in this process (bench/load_client.py). A request is good when its first token comes within 1 s and its tokens at
most 50 ms apart on average; goodput is good requests per second. Closed-loop clients send their next request
when the last ends, and when told 429 send the same request again after its Retry-After (as OpenAI's SDKs retry);
open-loop arrivals come at a rate (Poisson) and are not sent again when refused.

1. Closed loop, 2, 4, 8 and 64 clients: goodput, time to first token (TTFT), refusals, how fast they came, how
   often a client that waited its Retry-After was served on its next try, errors (5xx, broken streams).
2. Open loop at 0.5x to 4x the capacity (the best goodput of 1, now): the overload curve.
3. Fair share: one client of a second API key, alone, then beside 64 clients of another key: its TTFT p90.
4. Flex: one default client beside 64 `service_tier: flex` clients of its own key: its TTFT p90, and the flex
   clients' tokens.
5. A stream beside scoring a 120 kB document (`/v1/score`): its tokens per second, and its longest pause, against
   the same stream alone; and the scoring's pace while the stream runs, against its pace just before.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from txl_server.check.benchmark_docs import Section
from txl_server.sessions.redis_server import free_port

from .common import ROOT, export_revision
from .load_client import Tally, closed_loop, complete, open_loop, prompt

BEFORE = "ab36bf5"  # main before admission control (issue 44)
KEYS = "key-a,key-b"
CLIENTS = (2, 4, 8, 64)
LOADS = (0.5, 1.0, 2.0, 4.0)


class Server:
    """`python -m txl_server` from `tree` on the bundled model, with throw-away sessions and two API keys."""

    def __init__(self, tree: Path) -> None:
        self.port = free_port()
        path = os.pathsep.join(str(p) for p in (tree / "model", tree / "server"))
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TXL_")},
            "PYTHONPATH": path,
            "TXL_PORT": str(self.port),
            "TXL_EPHEMERAL": "1",
            "TXL_LOG_LEVEL": "warning",
            "TXL_API_KEYS": KEYS,
            "TXL_MAX_CONCURRENT_REQUESTS": "1024",  # as many clients as any scenario: the engine decides
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "txl_server"], cwd=tree, env=env, stdout=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"the server in {tree} exited at start")
            time.sleep(0.3)
        raise RuntimeError("the server did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _closed(port: int, clients: int, seconds: float, seed: int, **kwargs: object) -> Tally:
    tally = Tally()

    async def run() -> None:
        deadline = time.monotonic() + seconds
        rngs = [random.Random(seed * 1000 + i) for i in range(clients)]
        await asyncio.gather(
            *(closed_loop(port, tally, deadline, rng, key="key-a", **kwargs) for rng in rngs)
        )

    started = time.monotonic()
    asyncio.run(run())
    tally.seconds = time.monotonic() - started  # the window, and the requests still open at its end
    return tally


def _open(port: int, rate: float, seconds: float, seed: int) -> Tally:
    tally = Tally()
    started = time.monotonic()
    asyncio.run(open_loop(port, tally, rate, seconds, random.Random(seed), key="key-a"))
    tally.seconds = time.monotonic() - started
    return tally


def _beside(port: int, seconds: float, crowd: int, crowd_kwargs: dict, lone_key: str) -> tuple[Tally, Tally]:
    """A lone client (default tier, `lone_key`) beside `crowd` clients of key-a (`crowd_kwargs`)."""
    lone, many = Tally(seconds=seconds), Tally(seconds=seconds)

    async def run() -> None:
        deadline = time.monotonic() + seconds
        crowding = [
            closed_loop(port, many, deadline, random.Random(i), key="key-a", **crowd_kwargs)
            for i in range(crowd)
        ]
        await asyncio.sleep(0)
        await asyncio.gather(*crowding, closed_loop(port, lone, deadline, random.Random(99), key=lone_key))

    asyncio.run(run())
    return lone, many


def _stream_beside_score(port: int, document: str | None) -> tuple[float, float, float | None]:
    """(tokens per second, longest gap in seconds) of one 256-token stream, beside scoring `document`; and the
    scoring's pace beside the stream, against its own just before (None without a document): the worker's
    iterations that fed segments per second (`txl_prefill_step_seconds_count`), less the stream's own prompt."""

    async def run() -> tuple[float, float, float | None]:
        scoring = None
        pace = None
        if document is not None:
            body = {"text": document}
            scoring = asyncio.create_task(complete(port, body, key="key-b", path="/v1/score", timeout=600))
            await asyncio.sleep(0.5)  # the scoring is under way
            before = await asyncio.to_thread(_fed_steps, port)
            await asyncio.sleep(1.0)
            pace = await asyncio.to_thread(_fed_steps, port)
        body = {"prompt": prompt(random.Random(5)), "max_tokens": 256, "stream": True, "temperature": 1.0}
        seen = await complete(port, body, key="key-a")
        if scoring is not None and pace is not None:
            after = await asyncio.to_thread(_fed_steps, port)
            scoring.cancel()
            alone = (pace[1] - before[1]) / (pace[0] - before[0])
            beside = (after[1] - pace[1] - 1) / (after[0] - pace[0])
            kept: float | None = beside / alone
        else:
            kept = None
        stamps = seen.stamps
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        return (len(stamps) - 1) / (stamps[-1] - stamps[0]), max(gaps), kept

    return asyncio.run(run())


def _fed_steps(port: int) -> tuple[float, float]:
    """(now, the iterations that fed prompt segments so far), from the server's metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer key-a"}).text
    line = next(x for x in text.splitlines() if x.startswith("txl_prefill_step_seconds_count"))
    return time.monotonic(), float(line.split()[-1])


def _row(label: str, tally: Tally) -> list[object]:
    return [
        label,
        len(tally.seen),
        round(tally.goodput, 2),
        round(tally.ttft(50), 3),
        round(tally.ttft(90), 3),
        round(tally.ttft(99), 3),
        round(tally.tbt(90) * 1000, 1),
        len(tally.refused),
        f"{tally.refused_in_time:.0%}" if tally.refused else "–",
        round(tally.slowest_refusal, 3),
        tally.without_retry_after,
        f"{tally.next_try_served:.0%}" if tally.retried else "–",
        tally.errors,
    ]


HEADER = [
    "server",
    "requests",
    "goodput (req/s)",
    "TTFT p50 s",
    "TTFT p90 s",
    "TTFT p99 s",
    "TBT p90 ms",
    "refused",
    "refusals within 0.25 s",
    "slowest refusal s",
    "refusals without Retry-After",
    "served on the next try",
    "5xx or broken",
]


def run(quick: bool = False) -> Section:
    section = Section("load", "Overload: admission, fair share and priority", "python -m bench load")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    seconds = 8.0 if quick else 30.0
    document = (ROOT / "docs" / "default-model.md").read_text() * 8
    document = (document * (120_000 // len(document) + 1))[:120_000]
    with tempfile.TemporaryDirectory(prefix="txl-load-") as tmp:
        trees = {f"before ({BEFORE})": export_revision(BEFORE, Path(tmp) / "before"), "now": ROOT}
        results: dict[str, dict[str, object]] = {name: {} for name in trees}
        for name, tree in trees.items():
            with Server(tree) as server:
                print(f"{name}: closed loop", flush=True)
                results[name]["closed"] = {n: _closed(server.port, n, seconds, n) for n in CLIENTS}
        capacity = max(t.goodput for t in results["now"]["closed"].values())  # type: ignore[attr-defined]
        for name, tree in trees.items():
            with Server(tree) as server:
                print(f"{name}: open loop at {capacity:.2f} req/s capacity", flush=True)
                port = server.port
                results[name]["open"] = {x: _open(port, x * capacity, seconds, int(10 * x)) for x in LOADS}
                results[name]["alone"] = _closed(port, 1, seconds, 7)
                results[name]["tenants"] = _beside(port, seconds, 64, {}, "key-b")
                results[name]["flex"] = _beside(port, seconds, 64, {"tier": "flex"}, "key-a")
                results[name]["score"] = (
                    _stream_beside_score(port, None),
                    _stream_beside_score(port, document),
                )
    _tables(section, results, capacity)
    return section


def _tables(section: Section, results: dict[str, dict], capacity: float) -> None:
    rows = [_row(f"{name}, {n} clients", r["closed"][n]) for n in CLIENTS for name, r in results.items()]
    section.table("Closed loop: clients that retry after their Retry-After", HEADER, rows)
    rows = [
        [f"{name}, {x}x ({x * capacity:.2f} req/s)", *_row("", r["open"][x])[1:8], r["open"][x].errors]
        for x in LOADS
        for name, r in results.items()
    ]
    section.table(
        f"Open loop: offered load against capacity ({capacity:.2f} good requests/s, the best closed loop now)",
        ["server, offered", *HEADER[1:8], "5xx or broken"],
        rows,
    )
    rows = []
    for name, r in results.items():
        alone = r["alone"].ttft(90)
        for label, (lone, many) in (
            ("another key's 64 clients", r["tenants"]),
            ("64 flex clients", r["flex"]),
        ):
            lone_p90 = lone.ttft(90)
            rows.append(
                [name, label, round(alone, 3), round(lone_p90, 3), "yes" if lone_p90 <= 2 * alone + 0.25 else "no",
                 len(lone.served), many.tokens, len(many.refused), lone.errors + many.errors]
            )  # fmt: skip
    section.table(
        "One default client beside a crowd: its TTFT p90 against its own alone (within 2x + 0.25 s?)",
        ["server", "beside", "alone p90 s", "beside p90 s", "within", "its requests", "crowd's tokens",
         "crowd refused", "5xx or broken"],
        rows,
    )  # fmt: skip
    rows = []
    for name, r in results.items():
        (alone_rate, alone_gap, _), (beside_rate, beside_gap, scoring) = r["score"]
        rows.append([name, round(alone_rate, 1), round(beside_rate, 1), f"{beside_rate / alone_rate:.0%}",
                     round(alone_gap, 3), round(beside_gap, 3), f"{scoring:.0%}"])  # fmt: skip
    section.table(
        "A 256-token stream beside scoring a 120 kB document",
        [
            "server",
            "tokens/s alone",
            "tokens/s beside",
            "kept",
            "longest gap alone s",
            "longest gap beside s",
            "scoring's pace beside",
        ],
        rows,
    )
    section.note(
        "`kept`: the stream's tokens per second beside the scoring over alone (the bar: half; the scheduler gives "
        "flex and batch prompt segments a fifth of the time while streams decode). `scoring's pace beside`: the "
        "segments the scoring fed per second while the stream ran, over its pace alone just before."
    )
    section.note(
        "TTFT percentiles are of the requests served; 1 s and 50 ms are the goodput yardstick. "
        "`served on the next try`: of the clients refused, how many were served when they came back "
        "after their Retry-After. The machine is shared: absolute times are of that moment, before and now ran "
        "one after the other. AIPerf's and GuideLLM's figures of the server before admission control, and how "
        "they were run offline: [load-tools.md](load-tools.md)."
    )
