"""Streaming over HTTP: a real server process (uvicorn, embedded Redis) and asynchronous SSE clients.

Single-session streaming throughput is compared with the in-process engine on the same model in the same run;
then time to first token (TTFT) and inter-token latency (ITL) with 1, 16 and 64 concurrent streams, measured
client-side. Each stream: a fresh session with a 64-byte prompt, 32 sampled tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from txl_server.check.benchmark_docs import Section
from txl_server.sessions.redis_server import free_port
from txl_server.settings import BUNDLED_MODEL_DIR

from .common import percentile
from .engine import bundled_model, run_model

PROMPT = "It was the best of times, it was the worst of times, it was the age "  # 64+ bytes
LONG_TOKENS = 256
ROUNDS = 5


class Server:
    """`python -m txl_server` in a process of its own, ready to serve, its output in a log file. A server that
    exits before it is ready (a missing package, a device that fails) is noticed at once, its last lines raised
    with it, instead of after the whole start-up deadline."""

    STARTUP_SECONDS = 120
    TAIL_LINES = 30

    def __init__(self, model_dir: Path | None, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "TXL_LOG_LEVEL": "warning",
            "TXL_MAX_CONCURRENT_REQUESTS": "1024",
            "TXL_EPHEMERAL": "1",  # a benchmark's sessions are throw-away, never the user's kept ones
            **(env or {}),
        }
        if model_dir is not None:
            env["TXL_MODEL"] = str(model_dir)
        handle, name = tempfile.mkstemp(prefix="txl-bench-server-", suffix=".log")
        os.close(handle)
        self.log = Path(name)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "txl_server", "--port", str(self.port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + self.STARTUP_SECONDS
        while time.monotonic() < deadline:
            status = self.process.poll()
            if status is not None:
                raise RuntimeError(
                    f"the server exited with status {status} before it was ready:\n{self.tail()}"
                )
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server was not ready after {self.STARTUP_SECONDS} s:\n{self.tail()}")

    def tail(self) -> str:
        """The last lines the server printed (its log: `self.log`)."""
        lines = self.log.read_text(errors="replace").splitlines()[-self.TAIL_LINES :]
        return "\n".join(f"  | {line}" for line in lines) or "  (it printed nothing)"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


TOKEN_EVENT = b'data: {"type":"token"'


async def stream_once(client: httpx.AsyncClient, max_tokens: int, seed: int) -> tuple[float, list[float]]:
    """(seconds to first token, token arrival times) for one fresh session.

    The client does as little as it can per token (it counts token events in the raw bytes, stamping each with its
    chunk's arrival) because it shares this machine's two cores with the server it measures.
    """
    started = time.perf_counter()
    session = (await client.post("/v1/sessions", json={"text": PROMPT[:32]})).json()
    body = {"text": PROMPT[32:], "max_tokens": max_tokens, "temperature": 1.0, "seed": seed, "stream": True}
    stamps: list[float] = []
    tail = b""
    async with client.stream("POST", f"/v1/sessions/{session['id']}/generate", json=body) as response:
        async for chunk in response.aiter_raw():
            now = time.perf_counter()
            data = tail + chunk
            stamps.extend([now] * data.count(TOKEN_EVENT))
            tail = data[-len(TOKEN_EVENT) :]  # an event split across chunks is counted once, when complete
            if TOKEN_EVENT in tail:
                tail = b""
    return stamps[0] - started, stamps


async def concurrent(url: str, streams: int, max_tokens: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        await stream_once(client, 4, 0)  # warm-up
        started = time.perf_counter()
        results = await asyncio.gather(*(stream_once(client, max_tokens, i) for i in range(streams)))
        ended = time.perf_counter()
    ttft = [r[0] for r in results]
    gaps = [b - a for _, s in results for a, b in itertools.pairwise(s)]
    tokens = sum(len(s) for _, s in results)
    return {
        "tokens_per_s": tokens / (ended - started),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "itl_p50": percentile(gaps, 50),
        "itl_p99": percentile(gaps, 99),
    }


async def single_stream_rate(url: str) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        await stream_once(client, 8, 0)
        _, stamps = await stream_once(client, LONG_TOKENS, 1)
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def run(quick: bool = False) -> Section:
    section = Section("http", "HTTP streaming against the in-process engine", "python -m bench http")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    model, tokenizer, label = bundled_model()
    bundled = (BUNDLED_MODEL_DIR / "config.json").is_file()
    server = Server(None if bundled else _save_random(model))
    try:
        # In turns, several rounds: on a shared 2-core machine one pair varied from 64% to 90%.
        pairs = []
        for _ in range(1 if quick else ROUNDS):
            engine = run_model(model, tokenizer, (1,), LONG_TOKENS)[0].stream_rate
            http = asyncio.run(single_stream_rate(server.url))
            pairs.append((engine, http, http / engine))
        section.table(
            f"One session, {LONG_TOKENS} tokens, {label}: tokens/s, round by round",
            ["round", "in-process engine", "HTTP (SSE)", "HTTP / engine"],
            [[i + 1, e, h, f"{100 * r:.0f}%"] for i, (e, h, r) in enumerate(pairs)],
        )
        ratios = sorted(r for _, _, r in pairs)
        section.note(
            f"HTTP / engine: median {100 * ratios[len(ratios) // 2]:.0f}% "
            f"(from {100 * ratios[0]:.0f}% to {100 * ratios[-1]:.0f}% over {len(ratios)} rounds)."
        )
        rows = []
        for streams in (1, 16) if quick else (1, 16, 64):
            stats = asyncio.run(concurrent(server.url, streams, 32))
            rows.append([streams, stats["tokens_per_s"], stats["ttft_p50"] * 1000, stats["ttft_p99"] * 1000,
                         stats["itl_p50"] * 1000, stats["itl_p99"] * 1000])  # fmt: skip
        section.table(
            "Concurrent streams over HTTP: tokens/s and latency (ms)",
            ["streams", "tokens/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99"],
            rows,
        )
    finally:
        server.stop()
    section.note("Target: single-session HTTP streaming at least 90% of the in-process engine's tokens/s.")
    return section


def _save_random(model) -> Path:
    from txl import save_pretrained
    from txl.tokenizers import ByteTokenizer, save_tokenizer

    path = Path(tempfile.mkdtemp(prefix="txl-bench-")) / "model"
    save_pretrained(model, path)
    save_tokenizer(ByteTokenizer(), path)
    return path
