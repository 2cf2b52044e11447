"""One streamed session against the model's own decode step: what the serving path (the event loop, the hand-off
to the device worker, the server-sent events) adds to each token.

For each class of machine (this CPU; on a CPU with AVX-512 also an AVX2-only one, simulated as `python -m bench
cpu` does), in short turns: the model's own decode step at batch 1 (the bundled model, its memory full, the
server's thread count; `model(token, memory)` then the next-token distribution, chained, in a process of its own),
and one session streamed over HTTP from a server process (its memory filled by a 600-byte prompt; each turn
generates 48 more tokens on it at temperature 1; the gaps between token events at the client). Each figure is the
median of a turn's consecutive tokens, wall-clock, so that the ratio compares like with like; a turn takes a
fraction of a second, so that the three figures of a turn share the machine's state (on a machine shared with other
work, its load moves the figures from one turn to the next, much less their ratio within a turn). A server of the
revision before the serving-path work (`BEFORE`) streams in the same turns.
"""

from __future__ import annotations

import itertools
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
TOKENS = 48  # a turn's tokens
TURNS = 24
TARGET = 1.25


def step_probe() -> None:
    """In a process of its own: for each line N read, the model's own decode step, median milliseconds of N
    chained steps (printed, one line each)."""
    import txl
    from txl.kernels import fastest
    from txl.kernels.cpu.allocator import keep_freed_memory
    from txl_server.runtime import worker_threads
    from txl_server.settings import BUNDLED_MODEL_DIR, Settings

    keep_freed_memory()  # as the server does on a CPU
    torch.set_num_threads(worker_threads(Settings()))
    model = txl.load_pretrained(BUNDLED_MODEL_DIR)
    path = fastest("cpu")  # the kernels a server chooses on this CPU (its start-up check confirms them)
    with torch.inference_mode():
        memory = model.empty_memory(1)
        empty = memory
        _, memory = model(torch.tensor([list(PROMPT.encode())]), empty, path=path)  # full, as the stream's
        empty.release()
        token = torch.tensor([[32]])
        for line in sys.stdin:
            seconds = []
            for _ in range(int(line)):
                started = time.perf_counter()
                hidden, after = model(token, memory, path=path)
                memory.release()  # its blocks back to the pool at once (released by their owner)
                memory = after
                model.log_probs(hidden[:, -1], path)
                seconds.append(time.perf_counter() - started)
            print(1000 * statistics.median(seconds), flush=True)


class StepProbe:
    """The step probe's process (`env`: its machine class)."""

    def __init__(self, env: dict[str, str]) -> None:
        code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from bench.stream import step_probe; step_probe()"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], env={**os.environ, **env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip

    def median_ms(self, steps: int) -> float:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{steps}\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError("the step probe failed")
        return float(answer)

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)


class Stream:
    """One session on a server, its memory full, generating a burst of tokens a turn."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=300)
        self.session = self.client.post("/v1/sessions", json={"text": PROMPT}).json()["id"]

    def median_ms(self, tokens: int) -> float:
        """Median milliseconds between the token events of `tokens` generated on the session."""
        body = {"max_tokens": tokens, "temperature": 1.0, "stream": True}
        stamps: list[float] = []
        with self.client.stream("POST", f"/v1/sessions/{self.session}/generate", json=body) as response:
            for chunk in response.iter_raw():  # as little work per token as the client can do
                now = time.perf_counter()
                stamps.extend([now] * chunk.count(b'"type":"token"'))
        return 1000 * statistics.median(b - a for a, b in itertools.pairwise(stamps))

    def close(self) -> None:
        self.client.delete(f"/v1/sessions/{self.session}")
        self.client.close()


def _class(name: str, env: dict[str, str], before: Path, quick: bool) -> tuple[str, list[list[object]]]:
    servers = {
        "now": Server(None, env=env),
        "before": Server(None, env={**env, "PYTHONPATH": f"{before / 'server'}:{before / 'model'}"}),
    }
    probe = StepProbe(env)
    rows = []
    try:
        streams = {which: Stream(server.url) for which, server in servers.items()}
        for stream in streams.values():
            stream.median_ms(16)  # warm-up: tables, allocator, kernel choices
        probe.median_ms(50)
        for turn in range(4 if quick else TURNS):
            step = probe.median_ms(TOKENS)
            order = ["now", "before"] if turn % 2 == 0 else ["before", "now"]
            streamed = {which: streams[which].median_ms(TOKENS + 1) for which in order}
            rows.append([turn + 1, step, streamed["now"], streamed["before"],
                         streamed["now"] / step, streamed["before"] / step])  # fmt: skip
        for stream in streams.values():
            stream.close()
    finally:
        probe.stop()
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
        gain = statistics.median(r[2] / r[3] for r in rows)
        summary.append(f"{name}: one stream at {now:.2f}x the model's own step, median of {len(rows)} turns "
                       f"(`{BEFORE}`: {then:.2f}x; a token takes {gain:.2f}x its time there; target: at most "
                       f"{TARGET}x).")  # fmt: skip
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
