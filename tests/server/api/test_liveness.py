"""Liveness over real HTTP (a real server, a real Redis): `/health`, and the image's HEALTHCHECK and the
Kubernetes liveness probe that ask it, fail on a device poisoned by a sticky error and on a worker with work
waiting and no step finishing for TXL_WORKER_STALL_SECONDS; an idle worker, however long idle, stays alive."""

from __future__ import annotations

import threading
import time

import httpx
import torch
from txl_server import healthcheck
from txl_server.engine import device_failure

from tests.helpers.live_server import serve

from .test_api import error_of

KEY = "key-liveness"


def _probe(live) -> int:
    """The image's HEALTHCHECK command against `live` (exit status)."""
    return healthcheck.main(["--host", "127.0.0.1", "--port", str(live.port)])


def _started(client) -> str:
    session = client.post("/v1/sessions", json={"text": "hello"})
    assert session.status_code in (200, 201), session.text
    return session.json()["id"]


def test_a_poisoned_device_fails_liveness_and_the_probe(tiny_model_dir, redis_server, monkeypatch):
    """A step raising what torch raises for an illegal address: the request fails, and from then on `/health`
    is 503 (before: 200 for ever, so the pod left the Service and was never restarted)."""
    for live in serve(tiny_model_dir, redis_server.url, "liveness-device", api_keys=KEY):
        with live.client(KEY) as client:
            session = _started(client)
            assert client.get("/health").json() == {"status": "ok"} and _probe(live) == 0

            def poisoned(decode, chunks, **kwargs):
                raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

            monkeypatch.setattr(live.app.state.runtime.worker.runner, "run", poisoned)
            monkeypatch.setattr(device_failure, "device_works", lambda device: False)  # runs nothing more
            failed = client.post(
                f"/v1/sessions/{session}/generate", json={"max_tokens": 3}, headers={"Connection": "close"}
            )
            assert failed.status_code == 500
            health = client.get("/health")
            assert health.status_code == 503 and "illegal" not in health.text  # no internals leak
            assert error_of(health) == {
                "type": "unavailable",
                "message": "not alive: the device failed; restart the server",
                "param": None,
            }
            assert client.get("/ready").status_code == 503
            assert _probe(live) == 1


def test_a_stuck_worker_fails_liveness_and_the_probe_and_recovers_when_it_moves(
    tiny_model_dir, redis_server, monkeypatch
):
    """A step that never returns (a hung kernel, a deadlock), simulated by one waiting on an event: with a
    request waiting, `/health` turns 503 once TXL_WORKER_STALL_SECONDS pass with no step finishing, and the
    probe fails; an idle worker is alive however long it has been idle."""
    stall = 1.0
    for live in serve(
        tiny_model_dir, redis_server.url, "liveness-stall", api_keys=KEY, worker_stall_seconds=stall
    ):
        with live.client(KEY) as client:
            session = _started(client)
            time.sleep(2 * stall)  # idle beyond the limit: nothing waits, so alive
            assert client.get("/health").status_code == 200 and _probe(live) == 0

            runner = live.app.state.runtime.worker.runner
            step, release, entered = runner.run, threading.Event(), threading.Event()

            def hung(decode, chunks, **kwargs):
                entered.set()
                release.wait(60)
                return step(decode, chunks, **kwargs)

            monkeypatch.setattr(runner, "run", hung)
            answers: list[httpx.Response] = []

            def generate() -> None:
                with live.client(KEY) as other:
                    answers.append(other.post(f"/v1/sessions/{session}/generate", json={"max_tokens": 3}))

            waiting = threading.Thread(target=generate)
            waiting.start()
            try:
                assert entered.wait(30)
                assert client.get("/health").status_code == 200  # stuck for less than the limit: alive yet
                deadline = time.monotonic() + 10 * stall
                while (health := client.get("/health")).status_code == 200 and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert health.status_code == 503, health.text
                assert error_of(health)["message"].startswith("not alive: no step finished for")
                assert client.get("/ready").status_code == 503 and _probe(live) == 1
            finally:
                release.set()
                waiting.join(30)
            assert answers and answers[0].status_code == 200, answers
            assert client.get("/health").status_code == 200 and _probe(live) == 0
