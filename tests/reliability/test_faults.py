"""Faults: Redis restarted under traffic, the server SIGKILLed and restarted, clients leaving mid-stream, racing
writers, and more sessions than memory holds. After each, every committed session continues exactly.

Exactness is checked token by token: the tiny random model emits arbitrary bytes, so the streamed token ids of a
greedy continuation are compared, never re-encoded text.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass, field

import httpx
import pytest
from txl_server.sessions.redis_server import EmbeddedRedis, free_port

from tests.helpers.metrics import metric
from tests.helpers.server_process import ServerProcess, kill_mid_stream, process_env

from .conftest import KEY_A
from .servers import error_of, session_bytes, stream_tokens

pytestmark = pytest.mark.slow

APPEND = " tick"  # 5 tokens: a session's content is its start text plus this, once per committed step


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def replay_session(client: httpx.Client, text: str, appends: int) -> str:
    """A fresh session that took the same steps: `text`, then `appends` times APPEND."""
    sid = client.post("/v1/sessions", json={"text": text}).json()["id"]
    for _ in range(appends):
        assert client.post(f"/v1/sessions/{sid}/append", json={"text": APPEND}).status_code == 200
    return sid


def generate_retrying_conflicts(client: httpx.Client, sid: str, timeout: float = 15, **body):
    """Greedy stream; retries 409 while a dead writer's lease runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return stream_tokens(client, sid, **body)
        except AssertionError as exc:
            if "conflict" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# ---------------------------------------------------------------------------------------------- Redis restart


@dataclass
class Writer:
    """One client appending APPEND to its session in a loop; what it saw, by phase."""

    sid: str
    text: str
    start_tokens: int
    last_ok_version: int = 1
    uncertain: int = 0  # failed requests since the last success: each might have committed before Redis died
    statuses: dict[str, list[int]] = field(default_factory=lambda: {"before": [], "outage": [], "after": []})


async def _write_forever(client: httpx.AsyncClient, writer: Writer, clock: dict, stop: asyncio.Event) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            response = await client.post(f"/v1/sessions/{writer.sid}/append", json={"text": APPEND})
            status = response.status_code
        except httpx.TransportError:
            status = -1
        ended = time.monotonic()
        if clock["down"] <= started and ended <= clock["up"]:
            phase = "outage"
        elif ended < clock["down"]:
            phase = "before"
        else:
            phase = "after"
        writer.statuses[phase].append(status)
        if status == 200:
            body = response.json()
            writer.last_ok_version, writer.uncertain = body["session"]["version"], 0
        elif status == 503:
            assert error_of(response)["type"] == "unavailable"
            writer.uncertain += 1
        elif status != 409:  # a 409 never took the lease: it cannot have committed
            writer.uncertain += 1
        await asyncio.sleep(0.03)


def test_redis_restarted_under_traffic_fails_cleanly_and_every_session_continues(
    tiny_model_dir, tmp_path, logs_dir, figures
):
    redis = EmbeddedRedis(tmp_path / "redis-data", port=free_port())
    redis.start()
    server = ServerProcess(
        logs_dir / "redis-restart.log",
        TXL_MODEL=str(tiny_model_dir),
        TXL_REDIS_URL=redis.url,
        TXL_PERSISTENCE="always",
        TXL_LEASE_TTL_SECONDS="2",
    )
    try:
        server.start()
        figures.record("redis_restart", asyncio.run(_redis_restart_scenario(server, redis)))
    finally:
        server.stop()
        redis.stop()


async def _redis_restart_scenario(server: ServerProcess, redis: EmbeddedRedis) -> dict:
    clock = {"down": float("inf"), "up": float("inf")}
    async with server.async_client(limits=httpx.Limits(max_connections=32)) as client:
        writers = []
        for i in range(4):
            text = f"Redis outage, writer {i}."
            meta = (await client.post("/v1/sessions", json={"text": text})).json()
            writers.append(Writer(meta["id"], text, meta["tokens"]))
        bystander = (await client.post("/v1/sessions", json={"text": "untouched"})).json()
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_write_forever(client, w, clock, stop)) for w in writers]
        await asyncio.sleep(1.5)

        redis.kill()  # SIGKILL: no final save; the append-only file is all that survives
        clock["down"] = time.monotonic()
        await asyncio.sleep(0.3)
        sid = bystander["id"]
        probes = {
            "create": await client.post("/v1/sessions", json={"text": "x"}),
            "get": await client.get(f"/v1/sessions/{sid}"),
            "list": await client.get("/v1/sessions"),
            "append": await client.post(f"/v1/sessions/{sid}/append", json={"text": "x"}),
            "generate": await client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 4}),
            "generate_stream": await client.post(
                f"/v1/sessions/{sid}/generate", json={"max_tokens": 4, "stream": True}
            ),
            "fork": await client.post(f"/v1/sessions/{sid}/fork"),
            "snapshot": await client.get(f"/v1/sessions/{sid}/snapshot"),
            "delete": await client.delete(f"/v1/sessions/{sid}"),
            "completion_in_session": await client.post(
                "/v1/completions", json={"prompt": "x", "max_tokens": 2, "session_id": sid}
            ),
            "ready": await client.get("/ready"),
        }
        # Stateless routes need no Redis and keep working.
        stateless = {
            "score": (await client.post("/v1/score", json={"text": "still scoring"})).status_code,
            "completion": (
                await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            ).status_code,
        }
        await asyncio.sleep(1.2)

        redis.start()
        clock["up"] = time.monotonic()
        for _ in range(100):
            if (await client.get("/ready")).status_code == 200:
                break
            await asyncio.sleep(0.1)
        recovered_after = time.monotonic() - clock["up"]
        await asyncio.sleep(3.0)  # past the lease TTL (2 s): leases orphaned by the outage have expired
        stop.set()
        await asyncio.gather(*tasks)

    for name, response in probes.items():
        assert response.status_code == 503, (name, response.status_code, response.text)
        error = error_of(response)
        assert error.get("code", error["type"]) == "unavailable", name  # OpenAI routes: the code
    assert stateless == {"score": 200, "completion": 200}, stateless
    outage = [s for w in writers for s in w.statuses["outage"]]
    assert outage and set(outage) == {503}, outage
    for phase in ("before", "after"):
        statuses = [s for w in writers for s in w.statuses[phase]]
        assert 200 in statuses and set(statuses) <= {200, 409, 503}, (phase, statuses)

    checked = 0
    with server.client() as client:
        after = client.get(f"/v1/sessions/{sid}").json()
        assert (after["version"], after["tokens"]) == (bystander["version"], bystander["tokens"])
        for w in writers:
            meta = client.get(f"/v1/sessions/{w.sid}").json()
            version = meta["version"]
            assert w.last_ok_version <= version <= w.last_ok_version + w.uncertain, (vars(w), meta)
            steps = version - 1
            assert meta["tokens"] == w.start_tokens + len(APPEND) * steps, meta
            got, _ = generate_retrying_conflicts(client, w.sid, max_tokens=12)
            expected, _ = stream_tokens(client, replay_session(client, w.text, steps), max_tokens=12)
            assert got == expected, (w.sid, got, expected)
            checked += 1
    counts = {phase: sum(len(w.statuses[phase]) for w in writers) for phase in ("before", "outage", "after")}
    return {
        "writers": len(writers),
        "requests_by_phase": counts,
        "outage_503": len(outage),
        "outage_probe_routes_503": len(probes),
        "stateless_routes_during_outage": "200",
        "ready_again_seconds": round(recovered_after, 2),
        "sessions_continued_exactly": checked,
        "committed_steps": sum(w.last_ok_version - 1 for w in writers),
    }


# ---------------------------------------------------------------------------------------------- SIGKILL


def test_sigkilled_server_restarts_and_every_committed_session_continues_exactly(
    tiny_model_dir, redis_server, logs_dir, figures
):
    env = {
        **process_env(tiny_model_dir, redis_server.url, "kill"),
        "TXL_PERSISTENCE": "always",
        "TXL_LEASE_TTL_SECONDS": "2",
    }
    first = ServerProcess(logs_dir / "kill-1.log", **env).start()
    sessions = {}
    try:
        with first.client() as client:
            for i in range(4):
                sid = client.post("/v1/sessions", json={"text": f"Session {i} before the crash."}).json()[
                    "id"
                ]
                client.post(f"/v1/sessions/{sid}/append", json={"text": " More text" * (i + 1)})
                client.post(
                    f"/v1/sessions/{sid}/generate", json={"max_tokens": 8 + i, "temperature": 0.9, "seed": i}
                )
                meta = client.get(f"/v1/sessions/{sid}").json()
                # What an uninterrupted server answers next, from a fork made now (the same committed state).
                fork = client.post(f"/v1/sessions/{sid}/fork").json()["id"]
                expected, _ = stream_tokens(client, fork, max_tokens=16)
                twin = client.post(f"/v1/sessions/{sid}/fork").json()[
                    "id"
                ]  # left untouched, for after the crash
                sessions[sid] = (meta, expected, twin)
            victim = next(iter(sessions))
            kill_mid_stream(first, client, victim, after_lines=8)  # this step never commits
    finally:
        first.kill()
    assert first.process is not None and first.process.returncode == -9

    second = ServerProcess(logs_dir / "kill-2.log", **env).start()
    try:
        with second.client() as client:
            for sid, (meta, expected, twin) in sessions.items():
                now = client.get(f"/v1/sessions/{sid}").json()
                assert (now["version"], now["tokens"], now["mem_tokens"]) == (
                    meta["version"], meta["tokens"], meta["mem_tokens"]
                )  # fmt: skip
                got, done = generate_retrying_conflicts(client, sid, max_tokens=16)
                assert got == expected, (sid, got, expected)
                assert done["session"]["version"] == meta["version"] + 1
                from_twin, _ = stream_tokens(client, twin, max_tokens=16)
                assert from_twin == expected
    finally:
        second.stop()
    figures.record(
        "sigkill_restart",
        {"sessions": len(sessions), "continued_exactly": len(sessions), "killed_mid_stream": 1},
    )


# ---------------------------------------------------------------------------------------------- disconnects


async def _stream_then_leave(
    client: httpx.AsyncClient, sid: str, tokens_before_leaving: int, headers: dict | None = None
) -> int:
    """Streams a long generation and leaves after a few events; returns the HTTP status."""
    body = {"max_tokens": 4000, "stream": True, "temperature": 0}
    seen = 0
    async with client.stream("POST", f"/v1/sessions/{sid}/generate", json=body, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen >= tokens_before_leaving:
                    break  # leaving the block closes the connection
    return response.status_code


LIMIT = 8  # concurrency limit of the server for the disconnect tests


@pytest.fixture(scope="module")
def limited_server(tiny_model_dir, redis_server, logs_dir):
    env = process_env(tiny_model_dir, redis_server.url, "limited")
    with ServerProcess(logs_dir / "limited.log", **env, TXL_MAX_CONCURRENT_REQUESTS=str(LIMIT)) as server:
        yield server


def test_clients_leaving_mid_stream_stop_generation_free_the_slot_and_change_nothing(limited_server, figures):
    server = limited_server

    def cancellations() -> float:
        return metric(client.get("/metrics").text, "txl_cancellations_total")

    with server.client() as client:
        sessions = [
            client.post("/v1/sessions", json={"text": f"Stream {i} starts"}).json() for i in range(LIMIT)
        ]
        before = client.get("/metrics").text

        # One client alone: the job is dropped shortly after it leaves, and no decode step runs after that.
        decode_steps = metric(before, "txl_decode_step_seconds_count")
        assert asyncio.run(_leave_all(server, sessions[:1], tokens_before_leaving=3)) == [200]
        left = time.monotonic()
        expected = metric(before, "txl_cancellations_total") + 1
        assert wait_until(lambda: cancellations() >= expected, 10)
        cancel_seconds = time.monotonic() - left
        settled = client.get("/metrics").text
        steps_after = metric(settled, "txl_decode_step_seconds_count")
        time.sleep(0.3)
        assert metric(client.get("/metrics").text, "txl_decode_step_seconds_count") == steps_after
        assert metric(settled, "txl_active_jobs") == 0

        # All slots at once: every stream leaves; every job is cancelled and nothing changed.
        assert asyncio.run(_leave_all(server, sessions, tokens_before_leaving=4)) == [200] * LIMIT
        expected += LIMIT
        assert wait_until(lambda: cancellations() >= expected, 10)
        for session in sessions:
            now = client.get(f"/v1/sessions/{session['id']}").json()
            assert (now["version"], now["tokens"], now["mem_tokens"]) == (
                session["version"], session["tokens"], session["mem_tokens"]
            )  # fmt: skip
        # Every slot and every session is free at once: LIMIT new streams are all admitted (no 429, no 409).
        statuses = asyncio.run(_leave_all(server, sessions, tokens_before_leaving=2))
        assert statuses == [200] * LIMIT, f"right after their clients left, sessions answered {statuses}"
        assert wait_until(lambda: cancellations() >= expected + LIMIT, 10)
        overloaded = metric(client.get("/metrics").text, "txl_overloaded_total")
    assert overloaded == 0
    figures.record(
        "client_disconnect",
        {
            "streams_abandoned": 1 + 2 * LIMIT,
            "concurrency_limit": LIMIT,
            "seconds_to_cancellation_single": round(cancel_seconds, 3),
            "decode_steps_until_cancelled_single": int(steps_after - decode_steps),
            "sessions_changed": 0,
            "429_after_all_left": 0,
        },
    )


def test_a_stream_left_with_an_idempotency_key_can_be_retried(limited_server):
    """The first request failed (its client left), so a retry with its key runs anew (docs/api.md)."""
    with limited_server.client() as client:
        session = client.post("/v1/sessions", json={"text": "retry me"}).json()
        key = {"Idempotency-Key": "leave-" + uuid.uuid4().hex}
        cancelled = metric(client.get("/metrics").text, "txl_cancellations_total")
        assert asyncio.run(_leave_all(limited_server, [session], tokens_before_leaving=2, headers=key)) == [
            200
        ]
        assert wait_until(
            lambda: metric(client.get("/metrics").text, "txl_cancellations_total") > cancelled, 10
        )
        deadline = time.monotonic() + 2
        while True:
            response = client.post(
                f"/v1/sessions/{session['id']}/generate", json={"max_tokens": 3}, headers=key
            )
            if response.status_code != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert response.status_code == 200, response.text
        assert response.json()["session"]["version"] == session["version"] + 1


async def _leave_all(
    server: ServerProcess, sessions: list[dict], tokens_before_leaving: int, headers: dict | None = None
) -> list[int]:
    async with server.async_client(limits=httpx.Limits(max_connections=64)) as client:
        return list(
            await asyncio.gather(
                *(_stream_then_leave(client, s["id"], tokens_before_leaving, headers) for s in sessions)
            )
        )


def test_an_idle_worker_reports_no_active_jobs(a):
    """txl_active_jobs must fall back to 0 once the worker has nothing to do."""
    sid = a.post("/v1/sessions", json={"text": "gauge"}).json()["id"]
    assert a.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 8}).status_code == 200
    assert wait_until(lambda: metric(a.get("/metrics").text, "txl_active_jobs") == 0, 2), (
        "txl_active_jobs still reports a job after the worker went idle"
    )


# ---------------------------------------------------------------------------------------------- one writer


def test_twenty_parallel_appends_one_writer_at_a_time(api_server, figures):
    with api_server.client(KEY_A) as client:
        session = client.post("/v1/sessions", json={"text": "many writers"}).json()
    results = asyncio.run(_parallel_appends(api_server, session["id"], n=20))
    codes = sorted(status for status, _ in results)
    successes = sorted(
        (body for status, body in results if status == 200), key=lambda b: b["session"]["version"]
    )
    assert set(codes) <= {200, 409}, codes
    # Each waits for the writer before it (TXL_LEASE_WAIT_SECONDS, 5 s) instead of a 409 at once: nearly all
    # succeed, one after the other (a 409 only for a step that waited longer than that on a loaded machine).
    assert len(successes) >= 15, codes
    for status, body in results:
        if status == 409:
            assert body["error"]["type"] == "conflict"
    # Each success committed on top of the previous one: versions 2, 3, ... and tokens adding up in order.
    tokens = session["tokens"]
    for i, body in enumerate(successes):
        tokens += body["tokens"]
        assert body["session"]["version"] == session["version"] + i + 1
        assert body["session"]["tokens"] == tokens
    with api_server.client(KEY_A) as client:
        final = client.get(f"/v1/sessions/{session['id']}").json()
    assert final["tokens"] == session["tokens"] + sum(b["tokens"] for b in successes)
    assert final["version"] == session["version"] + len(successes)
    figures.record(
        "parallel_appends", {"requests": 20, "succeeded": len(successes), "conflicts": codes.count(409)}
    )


async def _parallel_appends(server: ServerProcess, sid: str, n: int) -> list[tuple[int, dict]]:
    rng = random.Random(5)

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, dict]:
        await asyncio.sleep(rng.uniform(0, 0.6))  # spread out, so that several can succeed one after another
        response = await client.post(f"/v1/sessions/{sid}/append", json={"text": f"[{i:02d}]" + "p" * 300})
        return response.status_code, response.json()

    async with server.async_client(KEY_A, limits=httpx.Limits(max_connections=n)) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(n))))


# ---------------------------------------------------------------------------------------------- memory pressure


def test_sessions_move_between_tiers_under_memory_pressure_and_come_back_identical(
    make_server, api_server, tiny_model_dir, figures
):
    working, compact = session_bytes(tiny_model_dir)
    budgets = {"device": 2 * working, "host": 2 * compact}  # room for 2 + 2 of the 8 sessions
    pressed = make_server(
        TXL_DEVICE_MEMORY_BYTES=str(budgets["device"]),
        TXL_HOST_MEMORY_BYTES=str(budgets["host"]),
        TXL_PERSISTENCE="evict",
    )
    n = 8
    peaks = {"device": 0.0, "host": 0.0}

    def check_budgets(client: httpx.Client) -> None:
        text = client.get("/metrics").text
        for tier in budgets:
            used = metric(text, "txl_memory_bytes", tier=tier)
            assert used <= metric(text, "txl_memory_budget_bytes", tier=tier), (tier, used, budgets)
            peaks[tier] = max(peaks[tier], used)

    with pressed.client() as p, api_server.client(KEY_A) as q:
        pairs = []
        for i in range(n):
            text = f"Session number {i} holds its own story, long enough to fill memory."
            pairs.append((p.post("/v1/sessions", json={"text": text}).json()["id"],
                          q.post("/v1/sessions", json={"text": text}).json()["id"]))  # fmt: skip
            check_budgets(p)
        # Touch them in order, then in reverse: each step brings a session back from host or Redis.
        for round_, order in enumerate((pairs, pairs[::-1])):
            for i, (ps, qs) in enumerate(order):
                body = {"text": f" step {round_}.{i}"}
                got = p.post(f"/v1/sessions/{ps}/append", json=body)
                want = q.post(f"/v1/sessions/{qs}/append", json=body)
                assert got.status_code == 200, got.text
                assert (got.json()["tokens"], got.json()["logprob"]) == pytest.approx(
                    (want.json()["tokens"], want.json()["logprob"]), rel=1e-5
                )
                check_budgets(p)
        moves = p.get("/metrics").text
        # Come back identical: the same next tokens as on a server that never evicted anything.
        for ps, qs in pairs:
            mine, theirs = p.get(f"/v1/sessions/{ps}").json(), q.get(f"/v1/sessions/{qs}").json()
            assert (mine["tokens"], mine["mem_tokens"], mine["version"]) == (
                theirs["tokens"], theirs["mem_tokens"], theirs["version"]
            )  # fmt: skip
            got, _ = stream_tokens(p, ps, max_tokens=16)
            expected, _ = stream_tokens(q, qs, max_tokens=16)
            assert got == expected, (ps, got, expected)
            check_budgets(p)
        for _, qs in pairs:
            q.delete(f"/v1/sessions/{qs}")
    tier_moves = {
        f"{source}->{target}": int(metric(moves, "txl_tier_moves_total", source=source, target=target))
        for source, target in (("device", "host"), ("host", "redis"), ("redis", "device"), ("host", "device"))
    }
    assert all(tier_moves.values()), tier_moves
    assert metric(moves, "txl_tier_moves_total", source="host", target="gone") == 0
    figures.record(
        "memory_pressure",
        {
            "sessions": n,
            "device_budget_bytes": budgets["device"],
            "host_budget_bytes": budgets["host"],
            "peak_device_bytes": int(peaks["device"]),
            "peak_host_bytes": int(peaks["host"]),
            "tier_moves": tier_moves,
            "continued_exactly": n,
        },
    )
