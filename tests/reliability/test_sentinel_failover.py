"""Redis fails over under traffic: a master, a replica and three Sentinels (real processes), the server following
`redis+sentinel://`, writers appending to their sessions while the master is SIGKILLed.

No acknowledged step is lost (a commit waits for the replica: Redis WAIT), every failure is a clean 503 with
Retry-After (or a 409 while a lease held through the failover runs out), no request hangs past its bound, steps
succeed again within 30 s, and every session then continues token for token as a replay of what its client was
told.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import pytest

from tests.helpers.live_server import LiveServer, live_settings
from tests.helpers.sentinel import SentinelGroup

from .servers import stream_tokens

pytestmark = pytest.mark.slow

APPEND = " tick"
TIMEOUT = 1.0  # TXL_REDIS_TIMEOUT_SECONDS
LEASE_TTL = 2.0
REQUEST_BOUND = 15.0  # the longest a request may take: a timeout, a settling within the lease, a lease wait


@dataclass
class Writer:
    sid: str
    text: str
    start_tokens: int
    acked: int = 1  # the version of its last 200
    uncertain: int = 0  # answers since then that leave the step's outcome unknown
    answers: list[tuple[float, int, float, str | None]] = field(default_factory=list)


async def _write(client: httpx.AsyncClient, writer: Writer, stop: asyncio.Event) -> None:
    while not stop.is_set():
        sent = time.monotonic()
        try:
            response = await client.post(f"/v1/sessions/{writer.sid}/append", json={"text": APPEND})
        except httpx.TransportError:
            writer.answers.append((sent, -1, time.monotonic() - sent, None))
            writer.uncertain += 1
            continue
        status = response.status_code
        writer.answers.append((sent, status, time.monotonic() - sent, response.headers.get("Retry-After")))
        if status == 200:
            writer.acked, writer.uncertain = response.json()["session"]["version"], 0
        elif status == 503 and response.json()["error"].get("code") == "outcome_unknown":
            writer.uncertain += 1
        await asyncio.sleep(0.02)


async def _create(client: httpx.AsyncClient, text: str) -> dict:
    """A session made before the fault, as a client would: told 503 or 429 (a replica still syncing, a busy
    machine), it waits the Retry-After and asks again."""
    deadline = time.monotonic() + 30
    while True:
        response = await client.post("/v1/sessions", json={"text": text})
        if (
            response.status_code == 201
            or time.monotonic() > deadline
            or response.status_code not in (429, 503)
        ):
            assert response.status_code == 201, response.text
            return response.json()
        await asyncio.sleep(float(response.headers.get("Retry-After", "1")))


async def _failover(live: LiveServer, group: SentinelGroup) -> tuple[list[Writer], float, int]:
    async with live.async_client() as client:
        writers = []
        for i in range(4):
            text = f"Failover writer {i}."
            meta = await _create(client, text)
            writers.append(Writer(meta["id"], text, meta["tokens"]))
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_write(client, w, stop)) for w in writers]
        await asyncio.sleep(2.0)
        killed_at = time.monotonic()
        killed = await asyncio.to_thread(group.kill_master)
        recovered = float("inf")
        while time.monotonic() - killed_at < 40:
            await asyncio.sleep(0.25)
            after = [a for w in writers for a in w.answers if a[0] > killed_at and a[1] == 200]
            if after:
                recovered = min(a[0] + a[2] for a in after) - killed_at
                break
        await asyncio.sleep(2.0)
        stop.set()
        await asyncio.gather(*tasks)
    return writers, recovered, killed


def test_a_sentinel_failover_under_traffic_loses_no_acknowledged_step(tiny_model_dir, tmp_path, figures):
    group = SentinelGroup(tmp_path).start()
    settings = live_settings(
        "failover",
        model=tiny_model_dir,
        redis_url=group.url,
        redis_timeout_seconds=TIMEOUT,
        lease_ttl_seconds=LEASE_TTL,
    )
    try:
        with LiveServer(settings) as live:
            assert live.app.state.runtime.service.store.wait_replicas == 1
            writers, recovered, killed = asyncio.run(_failover(live, group))
            assert group.master_port() != killed, "the Sentinels did not fail over"
            assert recovered < 30, f"steps succeeded again only {recovered:.1f} s after the master died"
            for writer in writers:
                statuses = {a[1] for a in writer.answers}
                assert statuses <= {200, 409, 503}, writer.answers
                assert all(a[3] for a in writer.answers if a[1] == 503), "a 503 without Retry-After"
                assert max(a[2] for a in writer.answers) < REQUEST_BOUND, max(
                    writer.answers, key=lambda a: a[2]
                )
            with live.client() as client:
                for writer in writers:
                    meta = client.get(f"/v1/sessions/{writer.sid}").json()
                    version = meta["version"]
                    assert writer.acked <= version <= writer.acked + writer.uncertain, (vars(writer), meta)
                    assert meta["tokens"] == writer.start_tokens + len(APPEND) * (version - 1)
                    replay = client.post("/v1/sessions", json={"text": writer.text + APPEND * (version - 1)})
                    expected, _ = stream_tokens(client, replay.json()["id"], max_tokens=8)
                    got, _ = stream_tokens(client, writer.sid, max_tokens=8)
                    assert got == expected, writer.sid
    finally:
        group.stop()
    answers = [a for w in writers for a in w.answers]
    failed = sum(1 for a in answers if a[1] != 200)
    row = {
        "fault": f"The Redis master SIGKILLed under {len(writers)} appending clients (a replica, three Sentinels)",
        "clients": f"{failed} of {len(answers)} requests 503 with Retry-After, the longest "
        f"{max(a[2] for a in answers):.2f} s; steps succeeded again {recovered:.1f} s after the kill",
        "lost": f"nothing ({sum(w.acked for w in writers)} acknowledged versions, each kept: commits wait for the "
        "replica)",
        "test": "test_sentinel_failover.py",
    }
    figures.record("store_faults", {"sentinel_failover": row})
