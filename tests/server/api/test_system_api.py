"""What serves, over HTTP: `/ready`'s body, `GET /v1/system`, the `serving` part of `/v1/models`; and `/ready`
failing after a device error that poisons the context (simulated), on a real server and a real Redis."""

from __future__ import annotations

import time

import openai
import torch
from txl_server.engine import device_failure

from tests.helpers.live_server import client_fixture, live_server_fixture, serve

from .test_api import error_of

KEY = "key-system"


# The latency targets left unset (the suite sets generous ones: tests/conftest.py): measured at start-up.
server = live_server_fixture(
    "system",
    api_keys=KEY,
    cuda_graphs=True,
    max_batch_size=4,
    ttft_target_seconds=None,
    tbt_target_seconds=None,
)
client = client_fixture(KEY)


def test_ready_says_what_serves(client):
    body = client.get("/ready").json()
    assert body["status"] == "ready" and body["model"] == "tiny-byte"
    assert body["device"] == "cpu" and body["dtype"] == "float32"
    assert body["attention"] in ("c", "torch") and body["cuda_graphs"] == "on"


def test_system_reports_the_device_the_kernel_the_graphs_the_pool_and_the_grid(client, server):
    info = client.get("/v1/system").json()
    assert info["object"] == "system" and info["model"] == "tiny-byte" and info["version"]
    serving = info["serving"]
    assert serving["device"] == "cpu" and serving["dtype"] == "float32" and serving["device_ok"]
    assert serving["attention"] in ("c", "torch")
    # On a CPU "on" is the graphs' static buffers, run eagerly: batch 1, 2, 4 x 3 top-k buckets x top-p.
    assert (
        serving["cuda_graphs"] == "on" and serving["graphs"] == 18 and "CPU" in serving["cuda_graphs_reason"]
    )
    pool = server.app.state.runtime.worker.pool
    assert serving["pool"] == {
        "blocks": pool.capacity,
        "block_size": 16,
        "bytes": pool.n_blocks * pool.block_nbytes,
        "fixed": False,
    }
    budgets = server.app.state.runtime.budgets  # a CPU's defaults (tests/server/test_memory_budgets.py)
    assert serving["budgets"] == {
        "device": budgets.device,
        "prefix_cache": budgets.prefix_cache,
        "host": 0,
        "how": budgets.how,
    }
    assert "1/16 of this machine's" in budgets.how
    # The tiny model: mem_len 32, segments of 8; a memory on the grid holds up to 32 + 8 - 1 positions.
    assert serving["window"] == {
        "grid": 8,
        "mem_len": 32,
        "max_mem_len": 32,
        "max_positions": 39,
        "same_length": False,
    }


def test_system_needs_a_key(server):
    with server.client() as anonymous:
        response = anonymous.get("/v1/system")
    assert response.status_code == 401 and error_of(response)["type"] == "unauthorized"


def test_the_openai_client_reads_the_model_entry_with_what_serves_it(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    (model,) = client.models.list().data
    assert model.id == "tiny-byte"
    serving = model.model_extra["serving"]
    assert (
        serving["device"] == "cpu"
        and serving["cuda_graphs"] == "on"
        and serving["attention"] in ("c", "torch")
    )


def test_ready_fails_after_a_device_error_that_poisons_the_context(tiny_model_dir, redis_server, monkeypatch):
    """A step raising what torch raises for an illegal address (simulated in the runner): that request fails,
    and from then on /ready answers 503, so that an orchestrator restarts the server; /v1/system says why."""
    for live in serve(tiny_model_dir, redis_server.url, "device-error", api_keys=KEY):
        with live.client(KEY) as client:
            assert client.get("/ready").status_code == 200
            session = client.post("/v1/sessions", json={"text": "hello"}).json()

            def broken(decode, chunks, **kwargs):
                raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

            monkeypatch.setattr(live.app.state.runtime.worker.runner, "run", broken)
            monkeypatch.setattr(device_failure, "device_works", lambda device: False)  # runs nothing more
            # (uvicorn closes a connection whose request raised: the next requests take a new one)
            failed = client.post(
                f"/v1/sessions/{session['id']}/generate",
                json={"max_tokens": 3},
                headers={"Connection": "close"},
            )
            assert failed.status_code == 500 and "illegal" not in failed.text  # no internals leak
            ready = client.get("/ready")
            assert ready.status_code == 503
            assert error_of(ready) == {
                "type": "unavailable",
                "message": "not ready: the device failed; restart the server",
                "param": None,
            }
            assert client.get("/v1/system").json()["serving"]["device_ok"] is False


def test_system_reports_the_admission_targets_measured_at_start_up(client, server):
    admission = client.get("/v1/system").json()["admission"]
    gate = server.app.state.runtime.worker.gate
    # Not set: measured for this device, at least the goodput yardstick's 1 s and 50 ms (admission/targets.py).
    assert (
        admission["measured"]
        and admission["ttft_target_seconds"] >= 1.0
        and admission["tbt_target_seconds"] >= 0.05
    )
    assert admission["ttft_target_seconds"] == gate.targets.ttft and 1 <= admission["row_cap"] <= 4
    assert (
        admission["max_concurrent_requests"] == 256
        and admission["max_concurrent_requests_per_tenant"] is None
    )


def test_system_says_how_many_requests_the_worker_runs_while_one_waits(client, server):
    """What a client waiting for its first token (the playground, `txl generate`) shows: the work beside it."""
    from tests.helpers.gate import Gate

    assert client.get("/v1/system").json()["work"] == {"requests_running": 0, "requests_waiting": 0}
    assert client.get("/v1/models").json()["data"][0]["bundled"] is False  # a model of the tests' own
    session = client.post("/v1/sessions", json={"text": "slow"}).json()
    runner = server.app.state.runtime.worker.runner
    with (
        Gate(runner, "run", delay=0.05),
        client.stream(
            "POST", f"/v1/sessions/{session['id']}/append", json={"text": "x" * 400, "stream": True}
        ) as streaming,
    ):
        assert streaming.status_code == 200
        # Taken in by the worker at its next iteration: waiting (in its inbox), then running.
        running = {"requests_running": 1, "requests_waiting": 0}
        seen = [client.get("/v1/system").json()["work"]]
        deadline = time.monotonic() + 10
        while seen[-1] != running and time.monotonic() < deadline:
            seen.append(client.get("/v1/system").json()["work"])
        assert seen[-1] == running, seen
        assert all(sum(work.values()) == 1 for work in seen), seen  # the append, waiting or running
        streaming.read()
