"""The load suite's clients: streamed `/v1/completions` over raw asyncio sockets (a client must cost the machine
little: it shares the cores with the server it measures), what each request saw, and the tallies made of them.

A request is good when its first token comes within GOOD_TTFT seconds and its tokens come at most GOOD_TBT apart
on average (the goodput yardstick of docs/benchmarks/load.md). A client told 429 waits its Retry-After
(retry-after-ms where sent, as OpenAI's SDKs do) and sends the same request again; whether that next try is
served is counted.
"""

from __future__ import annotations

import asyncio
import json
import random
import string
import time
from dataclasses import dataclass, field

from .common import percentile

GOOD_TTFT = 1.0
GOOD_TBT = 0.05
TOKEN_CHUNK = b'"finish_reason":null'  # each streamed chunk of a token holds it; the last chunk does not
DONE = b"data: [DONE]"


@dataclass
class Seen:
    """One request, as its client saw it."""

    status: int
    seconds: float  # until the answer's head (a refusal) or its end (a stream)
    stamps: list[float] = field(
        default_factory=list
    )  # arrival of each token's chunk, from the request's start
    retry_after: float | None = None  # seconds, on a 429
    done: bool = False  # a 200 stream that ended with [DONE]
    started: float = field(default_factory=time.monotonic)

    @property
    def good(self) -> bool:
        if self.status != 200 or not self.done or not self.stamps or self.stamps[0] > GOOD_TTFT:
            return False
        return len(self.stamps) < 2 or (self.stamps[-1] - self.stamps[0]) / (len(self.stamps) - 1) <= GOOD_TBT


async def complete(
    port: int, body: dict, *, key: str | None = None, path: str = "/v1/completions", timeout: float = 120
) -> Seen:
    """POSTs `body` and reads the answer: a stream's token chunks as they come, or a refusal's head."""
    started = time.perf_counter()
    payload = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    head += [f"Content-Length: {len(payload)}", "Connection: close"]
    if key is not None:
        head.append(f"Authorization: Bearer {key}")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        async with asyncio.timeout(timeout):
            status_line = await reader.readline()
            headers: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            status = int(status_line.split()[1])
            if status != 200:
                await reader.read()
                return Seen(status, time.perf_counter() - started, retry_after=_retry_after(headers))
            seen = Seen(status, 0.0)
            tail = b""
            while chunk := await reader.read(65536):
                now = time.perf_counter() - started
                data = tail + chunk
                seen.stamps.extend([now] * data.count(TOKEN_CHUNK))
                seen.done = seen.done or DONE in data
                tail = data[-len(TOKEN_CHUNK) :]  # a mark split between reads is counted once, when whole
            seen.seconds = time.perf_counter() - started
            return seen
    finally:
        writer.close()


def _retry_after(headers: dict[str, str]) -> float | None:
    if "retry-after-ms" in headers:
        return int(headers["retry-after-ms"]) / 1000
    if "retry-after" in headers:
        return float(headers["retry-after"])
    return None


def prompt(rng: random.Random, size: int = 128) -> str:
    """A prompt of `size` bytes new to the prefix cache (random words)."""
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < size:
        words.append("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))))
    return " ".join(words)[:size]


@dataclass
class Tally:
    """What a run's clients saw."""

    seen: list[Seen] = field(default_factory=list)
    retried: list[bool] = field(default_factory=list)  # after waiting its Retry-After: served on the next try
    tokens: int = 0
    seconds: float = 0.0

    def add(self, seen: Seen) -> None:
        self.seen.append(seen)
        self.tokens += len(seen.stamps)

    @property
    def served(self) -> list[Seen]:
        return [s for s in self.seen if s.status == 200]

    @property
    def refused(self) -> list[Seen]:
        return [s for s in self.seen if s.status == 429]

    @property
    def goodput(self) -> float:
        return sum(s.good for s in self.seen) / self.seconds if self.seconds else 0.0

    def ttft(self, q: float) -> float:
        return percentile([s.stamps[0] for s in self.served if s.stamps], q)

    def tbt(self, q: float) -> float:
        """Percentile of the served requests' mean time between tokens."""
        means = [(s.stamps[-1] - s.stamps[0]) / (len(s.stamps) - 1) for s in self.served if len(s.stamps) > 1]
        return percentile(means, q)

    @property
    def errors(self) -> int:
        """5xx answers, and streams that broke (a 200 that did not end with [DONE])."""
        return sum(s.status >= 500 or (s.status == 200 and not s.done) for s in self.seen)

    @property
    def slowest_refusal(self) -> float:
        return max((s.seconds for s in self.refused), default=0.0)

    @property
    def refused_in_time(self) -> float:
        """The share of refusals that came within 0.25 s."""
        refused = self.refused
        return sum(s.seconds <= 0.25 for s in refused) / len(refused) if refused else float("nan")

    @property
    def without_retry_after(self) -> int:
        return sum(s.retry_after is None for s in self.refused)

    @property
    def next_try_served(self) -> float:
        return sum(self.retried) / len(self.retried) if self.retried else float("nan")


async def closed_loop(
    port: int,
    tally: Tally,
    deadline: float,
    rng: random.Random,
    *,
    key: str | None = None,
    tier: str | None = None,
    max_tokens: int = 64,
) -> None:
    """One client: a request, then the next as soon as it ends; a request refused is sent again after its
    Retry-After, as OpenAI's SDKs retry (the same request)."""
    waited = False
    body: dict = {}
    while time.monotonic() < deadline:
        if not waited:
            body = {"prompt": prompt(rng), "max_tokens": max_tokens, "stream": True, "temperature": 1.0}
            if tier is not None:
                body["service_tier"] = tier
        try:
            seen = await complete(port, body, key=key)
        except (OSError, TimeoutError):
            tally.add(Seen(599, 0.0))
            await asyncio.sleep(0.1)
            continue
        tally.add(seen)  # one that ends past the window too: what it saw is the window's (its wait included)
        if waited:
            tally.retried.append(seen.status == 200)
        waited = seen.status == 429
        if waited:
            wait = seen.retry_after if seen.retry_after is not None else 1.0
            if time.monotonic() + wait >= deadline:
                break  # its next try would come after the window
            await asyncio.sleep(wait)


async def open_loop(
    port: int, tally: Tally, rate: float, seconds: float, rng: random.Random, *, key: str | None = None
) -> None:
    """Requests arriving at `rate` per second (Poisson) for `seconds`; a refused one is not sent again."""
    tasks = []
    deadline = time.monotonic() + seconds

    async def one() -> None:
        body = {"prompt": prompt(rng), "max_tokens": 64, "stream": True, "temperature": 1.0}
        try:
            tally.add(await complete(port, body, key=key))
        except (OSError, TimeoutError):
            tally.add(Seen(599, 0.0))

    while time.monotonic() < deadline:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
