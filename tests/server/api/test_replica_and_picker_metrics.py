"""Every response names its replica (X-TXL-Replica), and /metrics offers what an inference endpoint picker reads:
requests waiting and running, the device pool's use (0..1), its block size and size."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError
from txl_server.api.replica import replica_name
from txl_server.metrics import Metrics
from txl_server.settings import Settings

from tests.helpers.live_server import client_fixture, live_server_fixture
from tests.helpers.metrics import metric

REPLICA = "gpu-host-7.replica-2"


server = live_server_fixture(
    "replica",
    replica_id=REPLICA,
    max_body_bytes=4096,
    block_size=8,
    prefix_cache_bytes=0,  # what the pool holds is the sessions' memories alone
)
client = client_fixture()


def test_every_response_names_its_replica(server, client, monkeypatch):
    responses = {
        "health": client.get("/health"),
        "metrics": client.get("/metrics"),
        "playground": client.get("/"),
        "created": client.post("/v1/sessions", json={"text": "Whose replica?"}),
        "not found": client.get("/v1/sessions/" + "x" * 32),
        "no route": client.post("/v1/nowhere"),
        "invalid": client.post("/v1/sessions", json={"text": 5}),
    }
    with server.client() as once:  # the server closes a connection whose body it refused unread
        responses["too large"] = once.post("/v1/sessions", content=b"x" * 5000)
    session_id = responses["created"].json()["id"]
    with client.stream(
        "POST", f"/v1/sessions/{session_id}/generate", json={"max_tokens": 3, "stream": True}
    ) as stream:
        responses["stream"] = stream
        stream.read()
    service = server.app.state.runtime.service

    async def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(service, "list_sessions", explode)
    with server.client() as once:  # the server closes a connection after an unhandled error
        responses["internal"] = once.get("/v1/sessions")
    assert [r.status_code for r in responses.values()] == [200, 200, 200, 201, 404, 404, 422, 413, 200, 500]
    for what, response in responses.items():
        assert response.headers.get("x-txl-replica") == REPLICA, what


def test_the_replica_is_the_host_name_and_port_unless_set():
    assert replica_name(Settings(replica_id="r-1")) == "r-1"
    host = socket.gethostname()
    name = replica_name(Settings())
    assert name and len(name) <= 64 and all(c.isalnum() or c in "._-" for c in name)
    if all(c.isalnum() or c in "._-" for c in host) and len(host) <= 58:
        assert name == f"{host}-8000"
    assert replica_name(Settings(port=8001)) != name  # one server per GPU on one host: each its own name
    for bad in ("two words", "x" * 65, "", "a\r\nSet-Cookie: x"):
        with pytest.raises(ValidationError):
            Settings(replica_id=bad)


def pool_metrics(client: httpx.Client) -> tuple[float, dict[str, str]]:
    """(txl_kv_cache_usage_perc, labels of txl_cache_config_info)."""
    text = client.get("/metrics").text
    usage = None
    labels: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("txl_kv_cache_usage_perc "):
            usage = float(line.split()[1])
        if line.startswith("txl_cache_config_info{"):
            assert line.endswith(" 1.0"), line
            inside = line[line.index("{") + 1 : line.index("}")]
            labels = dict(pair.split("=") for pair in inside.split(","))
            labels = {k: v.strip('"') for k, v in labels.items()}
    assert usage is not None, text
    return usage, labels


def test_pool_use_is_blocks_in_use_over_blocks_in_the_pool(server, client):
    pool = server.app.state.runtime.worker.pool
    usage, labels = pool_metrics(client)
    assert labels == {"block_size": "8", "num_gpu_blocks": str(pool.capacity)}
    assert 0 <= usage < 1
    before = pool.used_blocks
    created = [client.post("/v1/sessions", json={"text": "Fill some blocks. " * 4}) for _ in range(3)]
    assert all(r.status_code == 201 for r in created)
    usage, labels = pool_metrics(client)
    assert pool.used_blocks > before  # the sessions' memories are on the device
    assert usage == pytest.approx(pool.used_blocks / pool.capacity)
    assert labels["num_gpu_blocks"] == str(pool.capacity)
    for response in created:
        client.delete(f"/v1/sessions/{response.json()['id']}")
    assert pool_metrics(client)[0] == pytest.approx(before / pool.capacity)


def test_running_counts_a_generation_while_it_runs_and_both_return_to_zero(client):
    session_id = client.post("/v1/sessions", json={"text": "Count me"}).json()["id"]
    seen = []
    with client.stream(
        "POST", f"/v1/sessions/{session_id}/generate", json={"max_tokens": 4000, "stream": True}
    ) as stream:
        lines = stream.iter_lines()
        for _ in range(6):
            next(lines)
        text = client.get("/metrics").text
        seen.append(metric(text, "txl_num_requests_running"))
    assert seen == [1.0]
    deadline = time.monotonic() + 10  # the closed stream is cancelled at the worker's next iteration
    while time.monotonic() < deadline:
        text = client.get("/metrics").text
        if metric(text, "txl_num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert metric(text, "txl_num_requests_running") == 0
    assert metric(text, "txl_num_requests_waiting") == 0


def test_waiting_and_running_are_the_worker_queue_report():
    """The worker reports (jobs not yet admitted, jobs in its batch) after each admission and each step; the
    pool's gauges appear once the engine's pool is watched."""
    metrics = Metrics()
    seen = []
    for queued, active in [(3, 2), (0, 5)]:
        metrics.on_queue(queued, active)
        text = generate_latest(metrics.registry).decode()
        seen.append((metric(text, "txl_num_requests_waiting"), metric(text, "txl_num_requests_running")))
    assert seen == [(3.0, 2.0), (0.0, 5.0)]
    assert "txl_kv_cache_usage_perc" not in text  # no pool yet: nothing rather than a made-up 0
