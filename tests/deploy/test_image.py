"""The image's install and start commands work: without a Docker engine, this runs the Dockerfile's own pip
commands (read from the Dockerfile, cpu variant) in a fresh virtual environment, then its ENTRYPOINT + CMD
with its ENV, and waits for /health and /ready.

Where a Docker engine answers, test_docker_image.py builds and runs the image itself, which covers all of this
and more: this test then skips rather than spend the same two minutes again.

What differs from `docker build --build-arg VARIANT=cpu`, and why:
- the venv's python stands in for the base image's; image paths (/src, /wheels, /data, ...) are temp dirs;
- TORCH_INDEX is the package index pip uses here (the torch==2.13.0 CPU wheel comes from the local wheels), and
  the torch it installs must be the one this test suite runs (the CPU build: this is the cpu variant);
- user and directory setup (useradd, mkdir, chown, installing the entry point) is skipped: it needs root, and the
  temp dirs exist; the entry point (which drops from root to txl) is left out of the start command;
- the server listens on loopback and a free port instead of 0.0.0.0:8000, on a tiny model the test makes
  (TXL_MODEL), since the bundled model may not be in the repo.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from txl_server.sessions.redis_server import free_port

from tests.helpers.tiny_models import make_byte_model_dir

from .docker_engine import docker_unavailable
from .files import REPO, Dockerfile, Stage, build_context, parse_dockerfile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

IMAGE_PATHS = ("/src", "/wheels", "/data", "/models", "/home/txl")
SETUP_ONLY = re.compile(r"^(useradd|mkdir|chown|install)\b")
ENTRYPOINT_SCRIPT = "txl-entrypoint"
APT_INSTALL = re.compile(r"^apt-get update\b")
# Something each package the image installs provides (a command, or a file), to find on this machine instead.
APT_PROVIDES = {"gcc": "gcc", "libc6-dev": "/usr/include/stdlib.h"}


class Emulator:
    def __init__(self, root: Path, dockerfile: Dockerfile, build_args: dict[str, str]) -> None:
        self.root = root
        self.dockerfile = dockerfile
        self.build_args = build_args
        self.venv = root / "venv"
        self.timings: dict[str, float] = {}
        clean = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("TXL_") and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
        }
        self.base_env = {
            **clean,
            "VIRTUAL_ENV": str(self.venv),
            "PATH": f"{self.venv / 'bin'}:{clean['PATH']}",
        }
        self.image_env: dict[str, str] = {}

    def map_paths(self, text: str) -> str:
        return re.sub(
            r"(?<![\w./-])(" + "|".join(map(re.escape, IMAGE_PATHS)) + r")(?=[/\s\"']|$)",
            lambda m: str(self.root / m.group(1).lstrip("/")),
            text,
        )

    def timed(self, label: str, command: list[str] | str, cwd: Path, env: dict[str, str]) -> None:
        started = time.monotonic()
        result = subprocess.run(
            command, cwd=cwd, env=env, shell=isinstance(command, str), capture_output=True, text=True
        )
        self.timings[label] = round(time.monotonic() - started, 1)
        assert result.returncode == 0, f"{label} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"

    def create_venv(self) -> None:
        self.timed("venv", [sys.executable, "-m", "venv", str(self.venv)], self.root, self.base_env)

    def run_stage(self, stage: Stage) -> None:
        """ARG, ENV, WORKDIR, COPY and RUN of one stage, in order; the rest only describes the image."""
        args: dict[str, str] = {}
        env: dict[str, str] = {}
        cwd = self.root
        values = self.dockerfile.stage_args(stage, self.build_args)
        for instruction in stage.instructions:
            if instruction.keyword == "ARG":
                name = instruction.args.partition("=")[0].strip()
                args[name] = values[name]
            elif instruction.keyword == "ENV":
                env.update(Stage("", None, [instruction]).env())
            elif instruction.keyword == "WORKDIR":
                cwd = Path(self.map_paths(instruction.args))
                cwd.mkdir(parents=True, exist_ok=True)
            elif instruction.keyword == "COPY":
                assert instruction.args == ". ." and not instruction.flags, f"unsupported COPY: {instruction}"
                for rel in build_context(REPO):
                    target = cwd / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / rel, target)
            elif instruction.keyword == "RUN":
                command = instruction.args
                if SETUP_ONLY.match(command):
                    continue
                if APT_INSTALL.match(
                    command
                ):  # needs root and the network: this machine's own tools stand in
                    for package, provided in APT_PROVIDES.items():
                        if re.search(rf"\b{re.escape(package)}=", command):
                            found = (
                                Path(provided).exists()
                                if provided.startswith("/")
                                else shutil.which(provided)
                            )
                            assert found, f"the image installs {package}; this machine lacks its {provided}"
                    continue
                assert "pip " in command, f"line {instruction.line}: teach test_image.py this RUN: {command}"
                run_env = {**self.base_env, **self.image_env, **env, **args}
                self.timed(f"{stage.name}: line {instruction.line}", self.map_paths(command), cwd, run_env)
        self.image_env.update(env)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_byte_model_dir(tmp_path_factory.mktemp("models") / "tiny-byte")


def test_image_commands_install_and_serve_in_a_fresh_venv(tmp_path, model_dir):
    if docker_unavailable() is None:
        pytest.skip("a Docker engine answers here: test_docker_image.py builds and runs the image itself")
    dockerfile = parse_dockerfile()
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")
    build_args = {"VARIANT": "cpu", "TORCH_INDEX": index, "PIP_INDEX_URL": index}
    emulator = Emulator(tmp_path, dockerfile, build_args)
    for path in IMAGE_PATHS:
        (tmp_path / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (tmp_path / "data" / "redis").mkdir()
    emulator.create_venv()

    runtime_chain = dockerfile.chain("runtime", build_args)
    for stage in runtime_chain[:-1]:  # the bases (the CPU one installs torch)
        emulator.run_stage(stage)
    emulator.run_stage(dockerfile.stage("build"))
    emulator.run_stage(runtime_chain[-1])
    installed = subprocess.run(
        [
            emulator.venv / "bin" / "python",
            "-c",
            "import torch; print(torch.__version__, torch.version.cuda)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    version, cuda = installed.stdout.split()
    assert version.split("+")[0] == torch.__version__.split("+")[0] and cuda == "None", installed.stdout

    runtime = runtime_chain[-1]
    entrypoint, cmd, healthcheck = (
        runtime.last("ENTRYPOINT"),
        runtime.last("CMD"),
        runtime.last("HEALTHCHECK"),
    )
    assert entrypoint is not None and cmd is not None and healthcheck is not None
    argv = entrypoint.exec_form() + cmd.exec_form()
    assert argv[0] == ENTRYPOINT_SCRIPT
    argv = argv[1:]  # the entry point's work needs root (tests/deploy/test_docker_image.py runs it)
    port = free_port()
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    assert argv[0] == "python"
    argv[0] = str(emulator.venv / "bin" / "python")

    image_env = {k: emulator.map_paths(v) for k, v in emulator.image_env.items()}
    assert image_env["TXL_DEVICE"] == "cpu"
    home = tmp_path / "home" / "txl"  # the image's user's home, where the native kernels are built and cached
    server_env = {**emulator.base_env, **image_env, "TXL_MODEL": str(model_dir), "HOME": str(home)}
    log = (tmp_path / "server.log").open("w")
    started = time.monotonic()
    server = subprocess.Popen(argv, cwd=tmp_path / "home" / "txl", env=server_env, stdout=log, stderr=log)
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=5) as client:
            for path in ("/health", "/ready"):
                deadline = time.monotonic() + 90
                while True:
                    assert server.poll() is None, "server exited:\n" + (tmp_path / "server.log").read_text()
                    try:
                        if client.get(path).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < deadline, f"no 200 from {path}"
                    time.sleep(0.2)
            emulator.timings["server ready"] = round(time.monotonic() - started, 1)
            # The image's compiler built the CPU kernels the server checked at start-up, in its user's home.
            built = {path.name.split("-")[0] for path in (home / ".cache" / "txl" / "kernels").glob("*.so")}
            assert {"paged_decode", "prefill_attention", "decode_layer"} <= built, built
            assert "txl_queue_depth" in client.get("/metrics").text
        # The HEALTHCHECK passes; told the address, as other servers' processes may run on this machine.
        probe = json.loads(healthcheck.args.removeprefix("CMD "))
        address = ["--host", "127.0.0.1", "--port", str(port)]
        probe = [str(emulator.venv / "bin" / "python"), *probe[1:], *address]
        assert subprocess.run(probe, env=server_env, timeout=30).returncode == 0
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
        log.close()
    # uvicorn shuts down cleanly, then re-raises SIGTERM on itself (exit 143 in a container): both are a stop.
    output = (tmp_path / "server.log").read_text()
    assert code in (0, -signal.SIGTERM) and "Application shutdown complete" in output, output
    print("image emulation timings (s):", emulator.timings)
