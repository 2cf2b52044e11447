"""One streamed session against the model's own decode step: what the serving path (the event loop, the hand-off
to the device worker, the server-sent events) adds to each token.

For each class of machine (this CPU; on a CPU with AVX-512 also an AVX2-only one, simulated as `python -m bench
cpu` does), in turns: the model's own decode step at batch 1 (the bundled model, its memory full, the server's
thread count; `model(token, memory)` then the next-token distribution, chained, in a process of its own), and one
session streamed over HTTP from a server process (its memory filled by a 600-byte prompt, then 256 tokens at
temperature 1; the gaps between token events at the client). Both figures are medians of consecutive tokens,
wall-clock, so that the ratio compares like with like. A server of the revision before the serving-path work
(`BEFORE`) streams in the same turns.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from txl_server.check.benchmark_docs import Section

from .common import ROOT, export_revision
from .cpu import SIMULATED_AVX2
from .http import Server

BEFORE = "ab36bf5"  # main before the serving-path work of issue 47
PROMPT = (ROOT / "tests" / "data" / "gutenberg" / "austen-persuasion.txt").read_text(encoding="utf-8")[:600]
TOKENS = 256
ROUNDS = 5
TARGET = 1.25


def step_probe() -> None:
    """In a process of its own: the model's own decode step, median milliseconds (printed)."""
    import txl
    from txl.kernels.allocator import keep_freed_memory
    from txl_server.runtime import worker_threads
    from txl_server.settings import BUNDLED_MODEL_DIR, Settings

    keep_freed_memory()  # as the server does on a CPU
    torch.set_num_threads(worker_threads(Settings()))
    model = txl.load_pretrained(BUNDLED_MODEL_DIR)
    steps = int(os.environ.get("STEPS", "300"))
    with torch.inference_mode():
        memory = model.empty_memory(1)
        _, memory = model(torch.tensor([list(PROMPT.encode())]), memory)  # a full memory, as the stream's
        token = torch.tensor([[32]])
        seconds = []
        for i in range(50 + steps):
            started = time.perf_counter()
            hidden, memory = model(token, memory)
            model.log_probs(hidden[:, -1])
            if i >= 50:
                seconds.append(time.perf_counter() - started)
    print(json.dumps({"step_ms": 1000 * statistics.median(seconds), "threads": torch.get_num_threads()}))


def _step(env: dict[str, str], steps: int) -> dict:
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from bench.stream import step_probe; step_probe()"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env, "STEPS": str(steps)},
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"the step probe failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


async def _stream(url: str, tokens: int) -> float:
    """Median milliseconds between token events of one session streamed from `url`."""
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        session = (await client.post("/v1/sessions", json={"text": PROMPT})).json()
        body = {"max_tokens": tokens, "temperature": 1.0, "seed": 1, "stream": True}
        stamps: list[float] = []
        async with client.stream("POST", f"/v1/sessions/{session['id']}/generate", json=body) as response:
            async for chunk in response.aiter_raw():  # as little work per token as the client can do
                now = time.perf_counter()
                stamps.extend([now] * chunk.count(b'"type":"token"'))
        await client.delete(f"/v1/sessions/{session['id']}")
    return 1000 * statistics.median(b - a for a, b in itertools.pairwise(stamps))


def _servers(env: dict[str, str], before: Path) -> dict[str, Server]:
    servers = {"now": Server(None, env=env)}
    servers["before"] = Server(None, env={**env, "PYTHONPATH": f"{before / 'server'}:{before / 'model'}"})
    return servers


def _class(name: str, env: dict[str, str], before: Path, quick: bool) -> tuple[str, list[list[object]]]:
    rows = []
    servers = _servers(env, before)
    try:
        for server in servers.values():
            asyncio.run(_stream(server.url, 16))  # warm-up: tables, allocator, kernel choices
        for turn in range(2 if quick else ROUNDS):
            step = _step(env, 100 if quick else 300)
            order = ["now", "before"] if turn % 2 == 0 else ["before", "now"]
            streamed = {which: asyncio.run(_stream(servers[which].url, TOKENS)) for which in order}
            rows.append([turn + 1, step["step_ms"], streamed["now"], streamed["before"],
                         streamed["now"] / step["step_ms"], streamed["before"] / step["step_ms"]])  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()
    return name, rows


def run(quick: bool = False) -> Section:
    section = Section("stream", "One streamed session against the model's own step", "python -m bench stream")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    classes = [("this CPU", {})]
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        classes.append(("AVX2 only (simulated)", SIMULATED_AVX2))
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        before = export_revision(BEFORE, Path(tmp) / "before")
        measured = [_class(name, env, before, quick) for name, env in classes]
    summary = []
    for name, rows in measured:
        now = statistics.median(r[4] for r in rows)
        then = statistics.median(r[5] for r in rows)
        summary.append(f"{name}: one stream at {now:.2f}x the model's own step (`{BEFORE}`: {then:.2f}x; target: "
                       f"at most {TARGET}x).")  # fmt: skip
    section.note(" ".join(summary))
    for name, rows in measured:
        section.table(
            f"{name}: milliseconds per token, turn by turn",
            [
                "turn",
                "model's own step",
                "stream",
                f"stream at `{BEFORE}`",
                "stream / step",
                f"`{BEFORE}` / step",
            ],
            rows,
        )
    section.note(f"Load average {load:.1f} when the run started and {os.getloadavg()[0]:.1f} when it ended.")
    return section
