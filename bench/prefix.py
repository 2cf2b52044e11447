"""The prefix cache over HTTP, on the bundled model: a real server process with the cache on, and one with it off
(`TXL_PREFIX_CACHE_BYTES=0`), side by side in one run.

- Few-shot completions (OpenAI `/v1/completions`): the same 2 kB prefix of examples, then one of many endings, 8
  tokens generated, one request after another; time to first token (streamed) and prompt tokens per second, and
  the tokens the answers say came from the cache.
- A session created from a 200 kB document it has read before (`POST /v1/sessions` with the same text a second
  time): cold against from the cache.
"""

from __future__ import annotations

import json
import statistics
import time

import httpx
from txl_server.check.benchmark_docs import Section

from .http import Server

EXAMPLES = "".join(
    f"English: {en}\nFrench: {fr}\n\n"
    for en, fr in [
        ("the cat sleeps", "le chat dort"),
        ("the dog runs", "le chien court"),
        ("a bird sings", "un oiseau chante"),
        ("the horse eats", "le cheval mange"),
        ("my house is small", "ma maison est petite"),
        ("the sea is blue", "la mer est bleue"),
        ("the sun rises", "le soleil se lève"),
        ("we read books", "nous lisons des livres"),
    ]
)
ENDINGS = [
    "the child plays",
    "a woman walks",
    "the tree grows",
    "the river flows",
    "the moon shines",
    "it rains",
]


def _few_shot(url: str, requests: int) -> tuple[float, float, float]:
    """(median seconds to first token, prompt tokens per second, share of prompt tokens from the cache)."""
    prefix = (EXAMPLES * 4)[:2048]
    firsts, rates, cached, total = [], [], 0, 0
    with httpx.Client(base_url=url, timeout=120) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        for i in range(requests):
            prompt = f"{prefix}English: {ENDINGS[i % len(ENDINGS)]} {i}\nFrench:"
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": 8,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            started = time.perf_counter()
            first = None
            with client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[len("data: ") :])
                    if first is None and event.get("choices"):
                        first = time.perf_counter() - started
                    if event.get("usage"):
                        usage = event["usage"]
                        cached += usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                        total += usage["prompt_tokens"]
            if i:  # the first request fills the cache: measure the others
                firsts.append(first or float("nan"))
                rates.append(len(prompt.encode()) / (first or float("nan")))
    return statistics.median(firsts), statistics.median(rates), cached / max(total, 1)


def _document(url: str) -> tuple[float, float]:
    """(seconds to create a session from a 200 kB document the first time, the second time)."""
    text = (EXAMPLES * 200)[: 200 * 1024]
    times = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for _ in range(2):
            started = time.perf_counter()
            response = client.post("/v1/sessions", json={"text": text})
            response.raise_for_status()
            times.append(time.perf_counter() - started)
            client.delete(f"/v1/sessions/{response.json()['id']}")
    return times[0], times[1]


def run(quick: bool = False) -> Section:
    section = Section("prefix", "The prefix cache over HTTP", "python -m bench prefix")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    requests = 4 if quick else 12
    rows, documents = [], []
    for label, env in (("on", {}), ("off", {"TXL_PREFIX_CACHE_BYTES": "0"})):
        server = Server(None, {"TXL_EPHEMERAL": "1", **env})
        try:
            first, rate, share = _few_shot(server.url, requests)
            rows.append([label, f"{first * 1e3:.0f}", f"{rate:,.0f}", f"{share:.0%}"])
            if not quick:
                documents.append((label, *_document(server.url)))
        finally:
            server.stop()
    section.table(
        "Few-shot completions: a 2 kB prefix, a new ending each time, 8 tokens (median over the requests after the first)",
        [
            "prefix cache",
            "time to first token, ms",
            "prompt bytes/s to the first token",
            "prompt tokens from the cache",
        ],
        rows,
    )
    if documents:
        section.table(
            "A session from a 200 kB document, created twice",
            ["prefix cache", "first create, s", "second create, s", "second / first"],
            [[label, f"{a:.1f}", f"{b:.2f}", f"{b / a:.3f}"] for label, a, b in documents],
        )
    return section
