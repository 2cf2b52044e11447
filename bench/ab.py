"""`python -m bench.ab REVISION [ROUNDS]`: a same-run A/B of this tree's HTTP decoding against an earlier
revision's. Two servers (the bundled model) are up at once and take requests in turns, one server busy at a time,
the order swapped every round: one stream's tokens/s and 16 concurrent streams' tokens/s, `/v1/completions`
streamed, 128 tokens at temperature 1 with a seed. Prints each figure's medians and the ratio now/before of each
round (the machine's load moves both servers' figures alike within a round)."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from .common import export_revision
from .load import ROOT, Server

H = {"Authorization": "Bearer key-a"}


async def stream(client, url, seed, model):
    body = {
        "model": model,
        "prompt": f"Chapter {seed}. It was a",
        "max_tokens": 128,
        "stream": True,
        "temperature": 1.0,
        "seed": seed,
    }
    n = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body, headers=H) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                n += 1
    return n


async def tokens_per_s(url, streams, seed):
    async with httpx.AsyncClient(timeout=120) as client:
        model = (await client.get(f"{url}/v1/models", headers=H)).json()["data"][0]["id"]

        async def one(i):
            body_seed = seed * 100 + i
            return await stream(client, url, body_seed, model)

        t = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(streams)))
        return sum(counts) / (time.perf_counter() - t)


def main(rev: str, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": export_revision(rev, Path(tmp) / "before"), "now": ROOT}
        servers = {k: Server(v) for k, v in trees.items()}
        try:
            urls = {k: f"http://127.0.0.1:{s.port}" for k, s in servers.items()}
            results = {k: {1: [], 16: []} for k in trees}
            for r in range(rounds):
                order = list(trees) if r % 2 == 0 else list(trees)[::-1]
                for streams in (1, 16):
                    for k in order:
                        results[k][streams].append(asyncio.run(tokens_per_s(urls[k], streams, r)))
            for streams in (1, 16):
                b = statistics.median(results["before"][streams])
                n = statistics.median(results["now"][streams])
                ratios = [
                    x / y for x, y in zip(results["now"][streams], results["before"][streams], strict=True)
                ]
                print(
                    f"{streams} stream(s): before {b:.1f} tok/s, now {n:.1f} tok/s, now/before median of rounds "
                    f"{statistics.median(ratios):.3f} (rounds: {', '.join(f'{x:.2f}' for x in ratios)})",
                    flush=True,
                )
        finally:
            for s in servers.values():
                s.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6)
