"""Load: 64 concurrent streaming clients against one server process with a concurrency limit of 48.

Each client keeps up to six sessions of its own and loops: create a session, generate with stream=true,
append, generate again; then revisits its older sessions. The only errors allowed are the 429s of the
configured limit. Time to first token and inter-token latency are measured by the clients; /metrics is sampled
every second to check each memory tier against its budget; at the end every session a client made must still
be there, at the version (and token count) that client last saw.

How many sessions the clients make, and so whether any reaches Redis, depends on the machine's speed (a CPU half
as fast made too few for one to come back from Redis). So after the timed load the test forces the tier paths it
asserts, whatever the speed: it creates sessions with a full memory until the server reports one moved down to
Redis, then revisits sessions, least recently used first, until one has come back from Redis.

The model is the bundled one when server/txl_server/default_model/config.json exists, the tiny test model
otherwise. TXL_LOAD_SECONDS sets the duration (default 60, the requirement; shorten it only for local runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.helpers.metrics import metric
from tests.helpers.server_process import ServerProcess, process_env

from .servers import BUNDLED_MODEL, percentile, session_bytes

pytestmark = pytest.mark.slow

CLIENTS = 64
LIMIT = 48
SESSIONS_PER_CLIENT = 6
MAX_TOKENS = 24
# Every tier must fit its budget at every sample, in flight too: the server makes room (moving least recently used
# sessions down, under one lock) before it places a new state.


@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)
    overloaded: int = 0
    errors: list[str] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    streams: int = 0
    budget_samples: int = 0
    over_budget_samples: int = 0
    budget_violations: list[str] = field(default_factory=list)
    peak: dict[str, float] = field(default_factory=lambda: {"device": 0.0, "host": 0.0})


@dataclass
class Owned:
    sid: str
    version: int
    tokens: int
    # When its client last used it: the order in which the server moves sessions down (least recently used).
    used: float = field(default_factory=time.monotonic)

    def saw(self, session: dict) -> None:
        self.version, self.tokens, self.used = session["version"], session["tokens"], time.monotonic()


class Busy(Exception):
    """A 429 from the concurrency limit: back off and try again."""


async def _request(client: httpx.AsyncClient, tally: Tally, kind: str, method: str, path: str, **kwargs):
    tally.requests[kind] += 1
    try:
        response = await client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        tally.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
        raise
    if response.status_code == 429 and "requests in flight" in response.text:
        tally.overloaded += 1
        raise Busy
    return response


async def _sse_lines(response: httpx.Response):
    """Lines as SSE defines them (ended by LF; CR is stripped). Not `aiter_lines`: httpx also splits at U+0085
    and U+2028, which a byte-level model can generate inside a token's text."""
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8")
    if buffer:
        yield buffer.decode("utf-8")


async def _generate(client: httpx.AsyncClient, tally: Tally, owned: Owned, rng: random.Random) -> None:
    body = {"max_tokens": rng.randint(8, MAX_TOKENS), "temperature": 0.8, "seed": rng.randrange(2**31),
            "stream": True}  # fmt: skip
    tally.requests["generate"] += 1
    started = time.perf_counter()
    last: float | None = None
    async with client.stream("POST", f"/v1/sessions/{owned.sid}/generate", json=body) as response:
        if response.status_code == 429 and "requests in flight" in (await response.aread()).decode():
            tally.overloaded += 1
            raise Busy
        if response.status_code != 200:
            tally.errors.append(f"generate: {response.status_code} {(await response.aread())[:200]!r}")
            return
        done = None
        async for line in _sse_lines(response):
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event["type"] == "token":
                if last is None:
                    tally.ttft.append(now - started)
                else:
                    tally.itl.append(now - last)
                last = now
                tally.tokens += 1
            elif event["type"] == "done":
                done = event
            else:
                tally.errors.append(f"generate stream: {event}")
    if done is None:
        tally.errors.append("generate: the stream ended without a done event")
        return
    tally.streams += 1
    owned.saw(done["session"])


async def _client(
    client: httpx.AsyncClient, index: int, deadline: float, tally: Tally, sessions: list[Owned]
) -> None:
    rng = random.Random(index)
    mine: list[Owned] = []
    step = 0
    while time.monotonic() < deadline:
        try:
            if len(mine) < SESSIONS_PER_CLIENT and step % 4 == 0:
                text = f"Client {index} opens session {len(mine)}: " + "a story " * rng.randint(1, 6)
                response = await _request(
                    client, tally, "create", "POST", "/v1/sessions", json={"text": text}
                )
                if response.status_code != 201:
                    tally.errors.append(f"create: {response.status_code} {response.text[:200]}")
                    continue
                meta = response.json()
                owned = Owned(meta["id"], meta["version"], meta["tokens"])
                mine.append(owned)
                sessions.append(owned)
            owned = mine[-1] if step % 4 != 3 else rng.choice(mine)
            if step % 2 == 0:
                await _generate(client, tally, owned, rng)
            else:
                text = " and then" * rng.randint(1, 4)
                path = f"/v1/sessions/{owned.sid}/append"
                response = await _request(client, tally, "append", "POST", path, json={"text": text})
                if response.status_code != 200:
                    tally.errors.append(f"append: {response.status_code} {response.text[:200]}")
                else:
                    owned.saw(response.json()["session"])
            step += 1
        except Busy:
            await asyncio.sleep(rng.uniform(0.2, 0.6))
        except httpx.HTTPError:
            await asyncio.sleep(0.1)


async def _sample_budgets(
    client: httpx.AsyncClient, tally: Tally, stop: asyncio.Event, slack: dict[str, int]
) -> None:
    while not stop.is_set():
        text = (await client.get("/metrics")).text
        tally.budget_samples += 1
        for tier in ("device", "host"):
            used = metric(text, "txl_memory_bytes", tier=tier)
            budget = metric(text, "txl_memory_budget_bytes", tier=tier)
            tally.peak[tier] = max(tally.peak[tier], used)
            if used > budget:
                tally.over_budget_samples += 1
            if used > budget + slack[tier]:
                tally.budget_violations.append(f"{tier}: {used:.0f} > {budget:.0f}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0)


async def _moves(client: httpx.AsyncClient, source: str, target: str) -> float:
    text = (await client.get("/metrics")).text
    return metric(text, "txl_tier_moves_total", source=source, target=target)


async def _push_one_down_to_redis(
    client: httpx.AsyncClient, tally: Tally, sessions: list[Owned], mem_len: int, most: int
) -> int:
    """Creates sessions that each fill their memory until a session has moved from the host tier to Redis (at
    most `most`: enough to overflow both tiers from empty). Returns how many it created."""
    base = "It was a dark and stormy night; the rain fell in torrents. " * (mem_len // 32 + 1)
    for made in range(most + 1):
        if await _moves(client, "host", "redis") > 0:
            return made
        # Each text its own from its first segment: sessions of one text would share their blocks through the
        # prefix cache, and a hundred of them fill no more memory than one.
        text = f"{made:05d} {base}"[:mem_len]
        response = await _request(client, tally, "fill", "POST", "/v1/sessions", json={"text": text})
        assert response.status_code == 201, response.text
        meta = response.json()
        sessions.append(Owned(meta["id"], meta["version"], meta["tokens"]))
    raise AssertionError(f"{most} full sessions never moved one to Redis: the budgets are not enforced")


async def _bring_one_back_from_redis(client: httpx.AsyncClient, tally: Tally, sessions: list[Owned]) -> int:
    """Appends to sessions, least recently used first (the ones the server moved down first), until one has come
    back from Redis; returns how many it visited. One of them is in Redis if any moved there (persistence is
    `evict` and nothing deletes), so this ends before the list does."""
    for visited, owned in enumerate(sorted(sessions, key=lambda o: o.used)):
        if await _moves(client, "redis", "device") > 0:
            return visited
        path = f"/v1/sessions/{owned.sid}/append"
        response = await _request(client, tally, "revisit", "POST", path, json={"text": " and then"})
        assert response.status_code == 200, response.text
        owned.saw(response.json()["session"])
    raise AssertionError("no session came back from Redis after every session was revisited")


async def _load(
    server: ServerProcess, seconds: float, slack: dict[str, int], mem_len: int, most_sessions: int
) -> tuple[Tally, list[Owned], float, dict[str, int]]:
    tally = Tally()
    sessions: list[Owned] = []
    limits = httpx.Limits(max_connections=CLIENTS + 8, max_keepalive_connections=CLIENTS + 8)
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample_budgets(client, tally, stop, slack))
        started = time.monotonic()
        deadline = started + seconds
        await asyncio.gather(*(_client(client, i, deadline, tally, sessions) for i in range(CLIENTS)))
        elapsed = time.monotonic() - started
        forced = {  # budgets are still sampled meanwhile
            "sessions_created_to_reach_redis": await _push_one_down_to_redis(
                client, tally, sessions, mem_len, most_sessions
            ),
            "sessions_revisited_to_come_back": await _bring_one_back_from_redis(client, tally, sessions),
        }
        stop.set()
        await sampler
    return tally, sessions, elapsed, forced


def _verify_sessions(server: ServerProcess, sessions: list[Owned]) -> list[str]:
    lost = []
    with server.client() as client:
        for owned in sessions:
            response = client.get(f"/v1/sessions/{owned.sid}")
            if response.status_code != 200:
                lost.append(f"{owned.sid}: {response.status_code}")
                continue
            meta = response.json()
            if (meta["version"], meta["tokens"]) != (owned.version, owned.tokens):
                lost.append(f"{owned.sid}: server {meta['version']}/{meta['tokens']}, "
                            f"client saw {owned.version}/{owned.tokens}")  # fmt: skip
    return lost


def test_sixty_four_streaming_clients_against_a_limit_of_forty_eight(
    tiny_model_dir, redis_server, logs_dir, figures
):
    seconds = float(os.environ.get("TXL_LOAD_SECONDS", "60"))
    bundled = (BUNDLED_MODEL / "config.json").exists()
    model_dir = BUNDLED_MODEL if bundled else tiny_model_dir
    working, compact = session_bytes(model_dir)
    # Room on the device for every request in flight at its peak and a few more (sessions at rest cost about
    # half that, so twice as many fit); a small host tier, so sessions that move down go on to Redis and come
    # back: every tier is exercised under load.
    budgets = {"device": (LIMIT + 8) * working, "host": 2 * compact}
    server = ServerProcess(
        logs_dir / "load.log",
        **process_env(model_dir, redis_server.url, "load"),
        TXL_MAX_CONCURRENT_REQUESTS=str(LIMIT),
        TXL_DEVICE_MEMORY_BYTES=str(budgets["device"]),
        TXL_HOST_MEMORY_BYTES=str(budgets["host"]),
        TXL_PERSISTENCE="evict",
    )
    mem_len = json.loads((Path(model_dir) / "config.json").read_text())["mem_len"]
    most_sessions = math.ceil((budgets["device"] + budgets["host"]) / compact) + 2
    with server:
        slack = {"device": 0, "host": 0}
        tally, sessions, elapsed, forced = asyncio.run(_load(server, seconds, slack, mem_len, most_sessions))
        lost = _verify_sessions(server, sessions)
        with server.client() as client:
            text = client.get("/metrics").text
    at_rest = {tier: metric(text, "txl_memory_bytes", tier=tier) for tier in budgets}
    tier_moves = {
        f"{source}->{target}": int(metric(text, "txl_tier_moves_total", source=source, target=target))
        for source, target in (("device", "host"), ("host", "redis"), ("redis", "device"), ("host", "device"))
    }
    requests = sum(tally.requests.values())
    figures.record(
        "load",
        {
            "model": "bundled" if bundled else "tiny test model",
            "model_dir": model_dir.name,
            "clients": CLIENTS,
            "concurrency_limit": LIMIT,
            "seconds": round(elapsed, 1),
            "requests": requests,
            "requests_by_kind": dict(tally.requests),
            "streams_completed": tally.streams,
            "tokens_streamed": tally.tokens,
            "tokens_per_second": round(tally.tokens / elapsed, 1),
            "overloaded_429": tally.overloaded,
            "server_overloaded_total": int(metric(text, "txl_overloaded_total")),
            "errors": len(tally.errors),
            "ttft_p50_ms": round(percentile(tally.ttft, 50) * 1e3, 1),
            "ttft_p99_ms": round(percentile(tally.ttft, 99) * 1e3, 1),
            "itl_p50_ms": round(percentile(tally.itl, 50) * 1e3, 2),
            "itl_p99_ms": round(percentile(tally.itl, 99) * 1e3, 2),
            "sessions": len(sessions),
            "sessions_lost_or_changed": len(lost),
            "device_budget_bytes": budgets["device"],
            "host_budget_bytes": budgets["host"],
            "peak_device_bytes": int(tally.peak["device"]),
            "peak_host_bytes": int(tally.peak["host"]),
            "budget_samples": tally.budget_samples,
            "samples_over_budget_in_flight": tally.over_budget_samples,
            "peak_device_over_budget_ratio": round(tally.peak["device"] / budgets["device"], 3),
            "peak_host_over_budget_ratio": round(tally.peak["host"] / budgets["host"], 3),
            "budget_violations_beyond_slack": len(tally.budget_violations),
            "device_bytes_at_rest": int(at_rest["device"]),
            "host_bytes_at_rest": int(at_rest["host"]),
            "tier_moves": tier_moves,
            **forced,
        },
    )
    assert not tally.errors, tally.errors[:20]
    assert tally.overloaded > 0, "64 clients never exceeded a limit of 48: the load did not load"
    assert tally.streams > 0 and tally.ttft and tally.itl
    assert not lost, lost[:20]
    assert tally.budget_samples >= seconds / 2
    assert not tally.budget_violations, tally.budget_violations[:20]
    assert all(at_rest[tier] <= budgets[tier] for tier in budgets), (at_rest, budgets)
    assert all(tier_moves[move] > 0 for move in ("device->host", "host->redis", "redis->device")), tier_moves
