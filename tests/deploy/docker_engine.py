"""A Docker engine for the image tests: whether one answers here (and why not), and its command line.

Any `docker` client runs containers; building needs one that drives BuildKit, which scripts/docker_build.sh
chooses itself (Debian bookworm's docker.io 20.10, or a newer client with the buildx plugin).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from functools import cache

DOCKER_SETUP = "apt-get install docker.io and start dockerd (.ci/run does both), or run the tests where a Docker engine runs"


@cache
def docker_unavailable() -> str | None:
    """None when a Docker engine answers here, else why the image tests cannot run."""
    binary = shutil.which("docker")
    if binary is None:
        return f"no docker command: {DOCKER_SETUP}"
    try:
        info = subprocess.run([binary, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"the Docker engine did not answer `docker info` in 30 s: {DOCKER_SETUP}"
    if info.returncode != 0 or not info.stdout.strip():
        return f"no Docker engine answers ({(info.stderr or info.stdout).strip()[:200]}): {DOCKER_SETUP}"
    return None


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return done


@dataclass
class Container:
    name: str

    def inspect(self) -> dict:
        return json.loads(docker("inspect", self.name).stdout)[0]

    def logs(self) -> str:
        done = docker("logs", self.name, check=False)
        return done.stdout + done.stderr

    def published(self, port: int) -> int:
        """The host port Docker published the container's `port` on (loopback)."""
        line = docker("port", self.name, f"{port}/tcp").stdout.splitlines()[0]
        return int(line.rsplit(":", 1)[1])

    def exec(self, *command: str) -> str:
        return docker("exec", self.name, *command).stdout

    def wait_for_health(self, status: str, within: float) -> float:
        """Seconds until Docker's health status is `status`."""
        started = time.monotonic()
        while True:
            state = self.inspect()["State"]
            assert state["Status"] == "running", f"{self.name} is {state['Status']}:\n{self.logs()[-3000:]}"
            if state.get("Health", {}).get("Status") == status:
                return time.monotonic() - started
            assert time.monotonic() - started < within, f"{self.name} not {status} in {within} s: {state}"
            time.sleep(0.5)

    def remove(self) -> None:
        docker("rm", "-f", "-v", self.name, check=False)
