"""A server process that is no longer alive ends itself (status 3), so that Docker's restart policy, compose or
systemd start it again as Kubernetes would (server/txl_server/watchdog.py): before, `/health` turned 503 and a
container under plain Docker stayed up, unhealthy, for ever. The faults are injected into a real
`python -m txl_server` through a `sitecustomize` module: once a marker file exists, a step hangs (a hung kernel)
or raises the error of a poisoned device. A restarted process continues the committed session."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
import pytest
from txl_server.watchdog import EXIT_NOT_ALIVE, Watchdog

from tests.helpers.server_process import ServerProcess, process_env

FAULTS = """
import os, threading
import torch
from txl_server.engine import device_failure, runner

MARKER = {marker!r}
run = runner.ModelRunner.run


def faulty(self, *args, **kwargs):
    if os.path.exists(MARKER):
        if {fault!r} == "hang":
            threading.Event().wait()  # a kernel that never returns
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    return run(self, *args, **kwargs)


runner.ModelRunner.run = faulty
probe = device_failure.device_works
device_failure.device_works = lambda device: not os.path.exists(MARKER) and probe(device)  # it runs nothing more
"""


def fault_hooks(tmp_path: Path, fault: str) -> tuple[Path, str]:
    """The marker file that turns `fault` on, and the PYTHONPATH that installs it in a server process."""
    marker = tmp_path / "fault-now"
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(FAULTS.format(marker=str(marker), fault=fault))
    return marker, os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH", "")) if p)


def test_the_watchdog_exits_once_liveness_fails_long_enough_and_not_for_a_blip():
    reasons = iter([None, "stuck", None, "stuck", "stuck", "stuck", "stuck"] + ["stuck"] * 50)
    exits: list[tuple[int, float]] = []
    started = time.monotonic()
    watchdog = Watchdog(
        lambda: next(reasons),
        lambda code: exits.append((code, time.monotonic() - started)),
        interval=0.02,
        confirm_seconds=0.05,
    )
    watchdog.start()
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [code for code, _ in exits] == [EXIT_NOT_ALIVE]
    # The blip (one "stuck" between two alive answers) did not count: the exit came after the 4th check at least.
    assert exits[0][1] >= 4 * 0.02


def test_a_stopped_watchdog_never_exits():
    exits: list[int] = []
    watchdog = Watchdog(lambda: "stuck", exits.append, interval=0.02, confirm_seconds=0.1)
    watchdog.start()
    watchdog.stop()
    time.sleep(0.3)
    assert exits == []


@pytest.mark.parametrize("fault", ["hang", "device"])
def test_a_process_that_is_not_alive_exits_3_and_a_restart_continues_its_session(
    fault, tiny_model_dir, redis_server, tmp_path
):
    marker, path = fault_hooks(tmp_path, fault)
    env = {
        **process_env(tiny_model_dir, redis_server.url, f"watchdog-{fault}"),
        "TXL_WORKER_STALL_SECONDS": "1",
        "TXL_LEASE_TTL_SECONDS": "2",
    }
    first = ServerProcess(tmp_path / "first.log", **env, PYTHONPATH=path).start()
    try:
        with first.client() as client:
            sid = client.post("/v1/sessions", json={"text": "Before the fault."}).json()["id"]
            committed = client.get(f"/v1/sessions/{sid}").json()
        marker.touch()
        answers: list[int | str] = []

        def doomed() -> None:
            try:
                with httpx.Client(base_url=first.url, timeout=60) as client:
                    answers.append(
                        client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 4}).status_code
                    )
            except httpx.TransportError as exc:  # the process ended under a hung step
                answers.append(type(exc).__name__)

        request = threading.Thread(target=doomed)
        request.start()
        assert first.wait(timeout=60) == EXIT_NOT_ALIVE
        request.join(timeout=30)
        log = first.log()
        reason = "no step finished" if fault == "hang" else "the device failed"
        assert f"not alive: {reason}" in log and "exiting with status 3" in log, log[-2000:]
        if fault == "device":
            assert answers == [500]  # the failing request got its answer before the process ended
    finally:
        first.stop()

    marker.unlink()
    second = ServerProcess(tmp_path / "second.log", **env).start()
    try:
        with second.client() as client:
            now = client.get(f"/v1/sessions/{sid}").json()
            assert (now["version"], now["tokens"]) == (committed["version"], committed["tokens"])
            deadline = time.monotonic() + 10
            while (
                step := client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 4})
            ).status_code == 409:
                assert time.monotonic() < deadline, step.text  # the dead process's lease runs out
                time.sleep(0.2)
            assert step.status_code == 200, step.text
    finally:
        second.stop()


def test_a_process_told_not_to_exit_stays_up_unhealthy(tiny_model_dir, redis_server, tmp_path):
    marker, path = fault_hooks(tmp_path, "device")
    env = process_env(tiny_model_dir, redis_server.url, "watchdog-off")
    server = ServerProcess(
        tmp_path / "off.log", **env, PYTHONPATH=path, TXL_EXIT_WHEN_NOT_ALIVE="false"
    ).start()
    try:
        with server.client() as client:
            sid = client.post("/v1/sessions", json={"text": "x"}).json()["id"]
            marker.touch()
            assert client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 2}).status_code == 500
            time.sleep(4)  # twice what the watchdog would have waited
            assert server.process is not None and server.process.poll() is None
            assert client.get("/health").status_code == 503
    finally:
        server.stop()
