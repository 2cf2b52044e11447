"""A Redis that lost data is noticed, never continued from; a Redis unfit to keep sessions is refused or reported.

Real redis-server processes under a server in this process: Redis restarted from an older RDB snapshot (every
session acknowledged after it answers 410 `store_lost_steps`, none is answered 200 at or below a version
acknowledged before), restarted empty (410 `store_lost_session`, not 404), configured to evict keys (refused at
start, `/ready` 503 when met later), and out of memory (`/ready` 503 with the reason, writes refused saying why,
Redis kept within its limit).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from txl_server.sessions.redis_server import EmbeddedRedis, free_port

from tests.helpers.live_server import LiveServer, live_settings
from tests.helpers.metrics import metric
from tests.helpers.server_process import REPO

pytestmark = pytest.mark.slow


def _wait_ready(client: httpx.Client, timeout: float = 30) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        response = client.get("/ready")
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def _restart(old: EmbeddedRedis, *, appendonly: bool, empty: bool = False) -> EmbeddedRedis:
    """`old` killed (SIGKILL) and a Redis started again on its port and directory: loading only its RDB snapshot
    (its append-only file removed), or nothing at all (`empty`)."""
    old.kill()
    data = old.data_dir
    for path in data.iterdir():
        if path.name.startswith("appendonly") or (empty and path.suffix == ".rdb"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    new = EmbeddedRedis(data, port=old.port, appendonly=appendonly)
    new.start()
    return new


@pytest.fixture
def redis_process(tmp_path) -> Iterator[list[EmbeddedRedis]]:
    """A Redis of this test's own (the list holds the one running now: a test restarts it)."""
    running = [EmbeddedRedis(tmp_path / "redis", port=free_port())]
    running[0].start()
    yield running
    running[-1].stop()


def _server(model: Path, url: str, **settings: object) -> LiveServer:
    return LiveServer(live_settings("losses", model=model, redis_url=url, **settings))


def _record(figures: object, fault: str, what: str, clients: str, lost: str, test: str) -> None:
    """A row of docs/reliability.md's table of store faults."""
    row = {"fault": what, "clients": clients, "lost": lost, "test": f"test_store_losses.py -k {test}"}
    figures.record("store_faults", {fault: row})  # type: ignore[attr-defined]


def _appended(client: httpx.Client, sid: str, n: int) -> int:
    version = 0
    for _ in range(n):
        response = client.post(f"/v1/sessions/{sid}/append", json={"text": " step"})
        assert response.status_code == 200, response.text
        version = response.json()["session"]["version"]
    return version


def test_a_redis_restarted_from_an_older_snapshot_is_noticed_and_no_session_reuses_a_version(
    tiny_model_dir, redis_process, caplog, figures
):
    with _server(tiny_model_dir, redis_process[0].url) as live, live.client() as client:
        steady = client.post("/v1/sessions", json={"text": "Untouched after the snapshot."}).json()
        sids = [
            client.post("/v1/sessions", json={"text": f"Rolled back {i}."}).json()["id"] for i in range(4)
        ]
        for sid in sids:
            _appended(client, sid, 1)
        redis.Redis(port=redis_process[0].port).save()  # the snapshot: every session at version <= 2
        acked = {sid: _appended(client, sid, 2) for sid in sids}  # acknowledged: version 4
        redis_process.append(_restart(redis_process[0], appendonly=False))
        assert _wait_ready(client).status_code == 200

        asks = [
            lambda sid: client.get(f"/v1/sessions/{sid}"),
            lambda sid: client.post(f"/v1/sessions/{sid}/append", json={"text": " again"}),
            lambda sid: client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 2}),
        ]
        for i, sid in enumerate(sids):  # half of them are stepped before anything reads them
            for ask in asks if i % 2 == 0 else asks[::-1]:
                response = ask(sid)
                assert response.status_code == 410, (sid, acked[sid], response.text)
                assert response.json()["error"]["code"] == "store_lost_steps"
        listed = {s["id"] for s in client.get("/v1/sessions").json()["data"]}
        assert listed == {steady["id"]}  # the rolled-back sessions are never listed again
        # A session the snapshot holds whole continues.
        assert _appended(client, steady["id"], 1) == steady["version"] + 1
        # The store-wide check noticed too (its commit count went back), loudly.
        deadline = time.monotonic() + 15
        while not metric(client.get("/metrics").text, "txl_store_data_loss_total", kind="older"):
            assert time.monotonic() < deadline, "the store's rollback was not noticed"
            time.sleep(0.5)
        metrics = client.get("/metrics").text
        assert metric(metrics, "txl_store_data_loss_total", kind="steps") == len(sids)
    assert any("THE SESSION STORE LOST DATA" in r.message and "older" in r.message for r in caplog.records)
    _record(
        figures,
        "older_snapshot",
        f"Redis SIGKILLed and restarted from an RDB snapshot older than {len(sids)} sessions' last 2 steps",
        "410 `store_lost_steps` for each of them (get, append, generate), never 200 at a reused version; they "
        "leave the list; sessions the snapshot holds whole continue; logged loudly, "
        '`txl_store_data_loss_total{kind="older"}`',
        "the steps Redis lost (said so, never continued from)",
        "older_snapshot",
    )


def test_a_redis_restarted_empty_answers_410_for_the_sessions_it_lost(
    tiny_model_dir, redis_process, caplog, figures
):
    with _server(tiny_model_dir, redis_process[0].url) as live, live.client() as client:
        sid = client.post("/v1/sessions", json={"text": "Lost whole."}).json()["id"]
        deleted = client.post("/v1/sessions", json={"text": "Deleted first."}).json()["id"]
        assert client.delete(f"/v1/sessions/{deleted}").status_code == 204
        redis_process.append(_restart(redis_process[0], appendonly=True, empty=True))
        assert _wait_ready(client).status_code == 200
        response = client.post(f"/v1/sessions/{sid}/append", json={"text": " more"})
        assert response.status_code == 410 and response.json()["error"]["code"] == "store_lost_session"
        assert client.get(f"/v1/sessions/{sid}").status_code == 410  # marked for every replica
        assert (
            client.get(f"/v1/sessions/{deleted}").status_code == 404
        )  # its deleted mark is gone: never known
        assert client.post("/v1/sessions", json={"text": "A new one."}).status_code == 201
        deadline = time.monotonic() + 15
        while not metric(client.get("/metrics").text, "txl_store_data_loss_total", kind="empty"):
            assert time.monotonic() < deadline, "the empty store was not noticed"
            time.sleep(0.5)
    assert any("came back empty" in r.message for r in caplog.records)
    _record(
        figures,
        "restarted_empty",
        "Redis SIGKILLed and restarted without its data",
        "410 `store_lost_session` for the sessions this server acknowledged (404 for one deleted before); logged "
        'loudly, `txl_store_data_loss_total{kind="empty"}`; new sessions are created',
        "what Redis lost (said so)",
        "restarted_empty",
    )


def test_an_evicting_redis_is_refused_at_start_in_one_line_unless_accepted(
    tiny_model_dir, redis_process, figures
):
    url = redis_process[0].url
    redis.Redis(port=redis_process[0].port).config_set("maxmemory-policy", "allkeys-lru")
    env = {"TXL_REDIS_URL": url, "TXL_MODEL": str(tiny_model_dir), "PATH": "/usr/bin:/bin"}
    started = subprocess.run(
        [sys.executable, "-m", "txl_server", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert started.returncode == 2, started.stderr
    lines = [line for line in started.stderr.splitlines() if "maxmemory-policy" in line]
    assert len(lines) == 1 and "allkeys-lru" in lines[0] and "noeviction" in lines[0], started.stderr
    with pytest.raises(RuntimeError):  # in process: the lifespan refuses it too
        _server(tiny_model_dir, url).start(timeout=60)
    with _server(tiny_model_dir, url, redis_allow_eviction=True) as live, live.client() as client:
        assert _wait_ready(client).status_code == 200
    _record(
        figures,
        "evicting",
        "A Redis with `maxmemory-policy allkeys-lru`",
        f"the server refuses to start, exit 2, one line: `{lines[0][:110]}...`; "
        "`TXL_REDIS_ALLOW_EVICTION=true` accepts it",
        "nothing (no session is kept in it)",
        "evicting_redis_is_refused",
    )


def test_a_redis_that_starts_evicting_or_runs_out_of_memory_makes_the_server_not_ready(
    tiny_model_dir, redis_process, figures
):
    admin = redis.Redis(port=redis_process[0].port)
    with _server(tiny_model_dir, redis_process[0].url) as live, live.client() as client:
        assert _wait_ready(client).status_code == 200
        admin.config_set("maxmemory-policy", "volatile-lru")  # a failover to a Redis configured otherwise
        ready = client.get("/ready")
        assert (
            ready.status_code == 503 and "maxmemory-policy volatile-lru" in ready.json()["error"]["message"]
        )
        admin.config_set("maxmemory-policy", "noeviction")
        assert _wait_ready(client).status_code == 200

        limit = int(admin.info("memory")["used_memory"]) + 256 * 1024
        admin.config_set("maxmemory", limit)
        refused = None
        for i in range(500):
            response = client.post("/v1/sessions", json={"text": f"Filling Redis, session {i}. " * 8})
            if response.status_code != 201:
                refused = response
                break
        assert refused is not None and refused.status_code == 503, "Redis never filled up"
        assert "out of memory" in refused.json()["error"]["message"], refused.text
        used = int(admin.info("memory")["used_memory"])
        assert used <= limit + 64 * 1024, f"Redis went {used - limit} bytes over its maxmemory"
        ready = client.get("/ready")
        assert ready.status_code == 503 and "out of memory" in ready.json()["error"]["message"]
        admin.config_set("maxmemory", 0)
        assert _wait_ready(client).status_code == 200
    _record(
        figures,
        "out_of_memory",
        "Redis reaches `maxmemory` (noeviction), or starts evicting (a failover to a Redis configured otherwise)",
        f'writes 503 "out of memory" after {i} creates, nothing changed; `/ready` 503 with the reason until '
        f"Redis has room again; Redis stayed within {max(0, used - limit)} bytes of its limit",
        "nothing",
        "runs_out_of_memory",
    )
