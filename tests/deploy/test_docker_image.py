"""The CPU image built and run in a real Docker engine: what a user of `docker run` and compose relies on.

The image is built once for the module (scripts/docker_build.sh: the registry's base and PyTorch's index where
they answer, else the stand-in base and a local package index), then:
- a container on a named volume is ready within READY_WITHIN, runs the server as txl (uid 10001), turns healthy,
  answers /metrics and has built the native kernels in txl's home;
- a session continues, token for token, after `docker restart` and after `docker stop` + `docker rm` + `docker run`
  on the same volume;
- SIGTERM (`docker stop` with compose's stop_grace_period) lets a running stream finish, and the server exits
  cleanly before the grace period ends;
- a root-owned bind mount at /data works (the entry point gives it to txl), and `--port 9000` turns healthy;
  started with `--user 10001` on such a mount, the container stops at once with the line that says what to do;
- `-e TXL_DEVICE=cuda` on the CPU image stops at once with one line, and compose's restart policy gives up.

Where no Docker engine answers the tests skip and say why; .ci/run installs one (docker.io) and makes the
stand-in base, so CI runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from .docker_engine import Container, docker, docker_unavailable
from .files import DEPLOY, REPO, interpolate

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

TAG = "txl-serve:test-cpu"
READY_WITHIN = 120.0  # seconds from `docker run` to /ready: 16 s measured on a shared 2-core machine
STREAM_SECONDS = 5.0  # how long the stream cut by SIGTERM should run: well within the 20 s grace period
RUN = os.getpid()  # container and volume names of this run


def compose_service() -> dict:
    raw = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    secrets = {"TXL_API_KEYS": "k", "GRAFANA_ADMIN_PASSWORD": "p"}
    return interpolate(raw, secrets)["services"]["txl"]


@pytest.fixture(scope="module")
def image() -> str:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(reason)
    started = time.monotonic()
    built = subprocess.run(
        ["bash", "scripts/docker_build.sh", "cpu", TAG],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    if built.returncode == 3:
        pytest.skip("no base image to build on: " + built.stderr.strip().splitlines()[-1])
    assert built.returncode == 0, built.stderr[-6000:]
    print(f"built {TAG} in {time.monotonic() - started:.0f} s: {built.stderr.strip().splitlines()[-1]}")
    return TAG


def run(image: str, name: str, *options: str, args: tuple[str, ...] = (), port: int = 8000) -> Container:
    docker("rm", "-f", name, check=False)
    docker("run", "-d", "--name", name, "-p", f"127.0.0.1::{port}", "--health-interval", "1s", *options, image,
           *args)  # fmt: skip
    return Container(name)


def wait_ready(
    container: Container, port: int = 8000, within: float = READY_WITHIN
) -> tuple[httpx.Client, float]:
    """A client of the container's server once /ready answers 200, and the seconds that took."""
    started = time.monotonic()
    client = httpx.Client(base_url=f"http://127.0.0.1:{container.published(port)}", timeout=60)
    while True:
        state = container.inspect()["State"]
        assert state["Status"] == "running", (
            f"{container.name} {state['Status']}:\n{container.logs()[-4000:]}"
        )
        try:
            if client.get("/ready").status_code == 200:
                return client, time.monotonic() - started
        except httpx.TransportError:
            pass
        assert time.monotonic() - started < within, f"not ready in {within} s:\n{container.logs()[-4000:]}"
        time.sleep(0.5)


def create(client: httpx.Client, text: str) -> str:
    created = client.post("/v1/sessions", json={"text": text})
    assert created.status_code == 201, created.text
    return created.json()["id"]


def fork(client: httpx.Client, session: str) -> str:
    forked = client.post(f"/v1/sessions/{session}/fork")
    assert forked.status_code == 201, forked.text
    return forked.json()["id"]


def greedy(client: httpx.Client, session: str, tokens: int = 24) -> str:
    answer = client.post(f"/v1/sessions/{session}/generate", json={"max_tokens": tokens, "temperature": 0})
    assert answer.status_code == 200, answer.text
    return answer.json()["text"]


class Served:
    """The module's server on a named volume; tests replace its container as a user would."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.volume = f"txl-test-{RUN}"
        self.name = f"txl-test-{RUN}-volume"
        self.container = run(image, self.name, "-v", f"{self.volume}:/data")
        self.client, self.ready_seconds = wait_ready(self.container)

    def replace(self) -> None:
        """`docker stop` + `docker rm`, then `docker run` on the same volume."""
        self.client.close()
        docker("stop", "-t", "30", self.name, timeout=60)
        docker("rm", self.name)
        self.container = run(self.image, self.name, "-v", f"{self.volume}:/data")
        self.client, _ = wait_ready(self.container)


@pytest.fixture(scope="module")
def served(image: str) -> Iterator[Served]:
    served = Served(image)
    yield served
    served.client.close()
    served.container.remove()
    docker("volume", "rm", "-f", served.volume, check=False)


def test_the_server_is_ready_in_time_runs_as_txl_and_turns_healthy(served: Served):
    assert served.ready_seconds < READY_WITHIN
    status = served.container.exec("cat", "/proc/1/status")
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    assert set(uids) == {"10001"}, status  # PID 1 is the server: the entry point exec'd it as txl
    assert "txl_queue_depth" in served.client.get("/metrics").text
    kernels = served.container.exec("ls", "/home/txl/.cache/txl/kernels").split()
    built = {name.split("-")[0] for name in kernels if name.endswith(".so")}
    assert {"paged_decode", "prefill_attention", "decode_layer"} <= built, kernels
    served.container.wait_for_health("healthy", within=60)
    assert served.client.get("/health").headers["x-txl-replica"].endswith("-8000")


def test_a_session_continues_after_restart_and_in_a_new_container_on_the_volume(served: Served):
    client = served.client
    session = create(client, "It was a dark and stormy night; the rain fell in torrents")
    first, second = fork(client, session), fork(client, session)
    expected = greedy(client, first)
    docker("restart", "-t", "30", served.name, timeout=90)
    served.client.close()
    served.client, _ = wait_ready(served.container)
    assert greedy(served.client, session) == expected  # the memory itself survived, not only the listing
    served.replace()
    assert greedy(served.client, second) == expected


def test_sigterm_lets_a_running_stream_finish_within_the_compose_grace_period(served: Served):
    grace = int(compose_service()["stop_grace_period"].removesuffix("s"))
    session = create(served.client, "Once upon a time")
    started = time.monotonic()
    greedy(served.client, session, tokens=100)  # this machine's speed, for a stream of about STREAM_SECONDS
    tokens = max(200, min(4000, int(STREAM_SECONDS * 100 / (time.monotonic() - started))))
    events: list[dict] = []
    first_token = threading.Event()

    def consume() -> None:
        body = {"max_tokens": tokens, "temperature": 0, "stream": True}
        with served.client.stream("POST", f"/v1/sessions/{session}/generate", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line.removeprefix("data: ")))
                    first_token.set()

    reader = threading.Thread(target=consume)
    reader.start()
    assert first_token.wait(60), served.container.logs()[-3000:]
    in_flight = len(events)
    started = time.monotonic()
    docker("stop", "-t", str(grace), served.name, timeout=grace + 30)
    stopped = time.monotonic() - started
    reader.join(30)
    assert in_flight < tokens, "the stream ended before SIGTERM: nothing was drained"
    assert events[-1]["type"] == "done", events[-1]
    assert events[-1]["finish_reason"] == "length" and events[-1]["usage"]["completion_tokens"] == tokens
    state = served.container.inspect()["State"]
    assert state["ExitCode"] == 0 and not state["OOMKilled"], state  # not 137: it was not killed
    assert stopped < grace, f"stopped in {stopped:.1f} s"


def test_a_root_owned_bind_mount_is_given_to_txl_and_another_port_turns_healthy(image: str, tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    docker("run", "--rm", "--entrypoint", "chown", "-v", f"{data}:/data", image, "0:0", "/data")
    container = run(image, f"txl-test-{RUN}-bind", "-v", f"{data}:/data", args=("--port", "9000"), port=9000)
    try:
        client, _ = wait_ready(container, port=9000)
        create(client, "A bind mount")
        client.close()
        assert "/data now belongs to txl" in container.logs()
        container.wait_for_health("healthy", within=60)  # the probe found port 9000
        owners = docker("run", "--rm", "--entrypoint", "stat", "-v", f"{data}:/data", image, "-c", "%u",
                        "/data", "/data/redis", "/data/redis/appendonly.aof").stdout.split()  # fmt: skip
        assert set(owners) == {"10001"}, owners
    finally:
        container.remove()
        docker(
            "run",
            "--rm",
            "--entrypoint",
            "rm",
            "-v",
            f"{data}:/data",
            image,
            "-rf",
            "/data/redis",
            check=False,
        )


def test_as_another_user_an_unwritable_data_dir_stops_with_what_to_do(image: str, tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    docker("run", "--rm", "--entrypoint", "chown", "-v", f"{data}:/data", image, "0:0", "/data")
    done = docker(
        "run", "--rm", "--user", "10001:10001", "-v", f"{data}:/data", image, check=False, timeout=60
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert "/data (owner 0:0) is not writable by uid 10001" in lines[0]
    assert "chown -R 10001:10001" in lines[0] and "-v txl-data:/data" in lines[0]


def test_a_cuda_device_on_the_cpu_image_says_so_at_once_and_compose_gives_up(image: str):
    started = time.monotonic()
    done = docker("run", "--rm", "-e", "TXL_DEVICE=cuda", image, check=False, timeout=120)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("TXL_DEVICE=cuda, but this is the CPU image"), lines
    assert time.monotonic() - started < 60

    policy = compose_service()["restart"]  # on-failure:N
    retries = int(policy.partition(":")[2])
    container = Container(f"txl-test-{RUN}-restart")
    docker("run", "-d", "--name", container.name, "--restart", policy, "-e", "TXL_DEVICE=cuda", image)
    try:
        deadline = time.monotonic() + 120
        while True:
            state = container.inspect()
            if state["State"]["Status"] == "exited" and state["RestartCount"] == retries:
                break
            assert time.monotonic() < deadline, state["State"]
            time.sleep(1)
        time.sleep(3)
        state = container.inspect()
        assert state["State"]["Status"] == "exited" and state["RestartCount"] == retries, state["State"]
        assert container.logs().count("TXL_DEVICE=cuda, but") == retries + 1
    finally:
        container.remove()
