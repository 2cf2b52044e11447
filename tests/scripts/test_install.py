"""scripts/install.sh: which torch it installs (the CPU build without an NVIDIA GPU, from PyTorch's CPU index when it
answers, else the default index with a note) and that it says which; its pip wrapper keeps setuptools' "Editable
installation" warning blocks out of the log.

The torch tests check the decision and the message, with pip replaced by an echo: pip's own configuration here
(a local CPU wheel in its find-links) would satisfy `torch==2.13.0` from any index.

The script is sourced, which only defines its functions, and its `pip_quietly` runs an editable install of a
small package into a fresh virtual environment, next to the same install without it (which must show the block,
or this test proves nothing on this setuptools).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WARNING = "Editable installation"


@pytest.fixture(scope="module")
def venv_and_package(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("install")
    package = root / "demo"
    (package / "demo").mkdir(parents=True)
    (package / "demo" / "__init__.py").write_text("ANSWER = 42\n")
    (package / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "demo"\nversion = "0.1"\n'
    )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # As install.sh does first: the pip a venv starts with hides the build backend's output anyway.
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True, capture_output=True, timeout=300)
    return venv, package


def editable_install(venv: Path, package: Path, wrapper: str) -> subprocess.CompletedProcess[str]:
    script = (
        f'source scripts/install.sh && {wrapper} "$VENV/bin/python" -m pip install --quiet '
        '--disable-pip-version-check -e "$PACKAGE"'
    )
    env = {**os.environ, "VENV": str(venv), "PACKAGE": str(package)}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_pip_quietly_keeps_the_editable_installation_warnings_out(venv_and_package):
    venv, package = venv_and_package
    plain = editable_install(venv, package, wrapper="")
    assert plain.returncode == 0, plain.stderr
    assert WARNING in plain.stderr, "setuptools no longer warns: nothing left to filter"

    quiet = editable_install(venv, package, wrapper="pip_quietly")
    assert quiet.returncode == 0, quiet.stderr
    assert WARNING not in quiet.stderr and "!!" not in quiet.stderr, quiet.stderr
    imported = subprocess.run([venv / "bin" / "python", "-c", "import demo; print(demo.ANSWER)"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert imported.stdout.strip() == "42", imported.stderr


def test_sourcing_the_script_installs_nothing(tmp_path):
    """`main` runs only when the script is executed: sourcing it from elsewhere changes no directory."""
    done = subprocess.run(
        ["bash", "-c", f"source {REPO / 'scripts' / 'install.sh'} && pwd && type pip_quietly >/dev/null"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path), done.stderr
    assert not (tmp_path / ".venv").exists()


# ---------------------------------------------------------------- which torch


FAKE_PIP = (
    'pip_quietly() { echo "$@"; }; '
    'pip() { if [[ " $* " == *" --dry-run "* ]]; then cat "${REPORT:-/dev/null}"; else echo "$@"; fi; }'
)


def run_sourced(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`script` after sourcing install.sh, with PATH cut to this machine's system directories (no nvidia-smi
    unless the test puts one in tmp_path/bin) and pip replaced by an echo of its arguments (asked for a dry run's
    report, it prints $REPORT's file, if any)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TORCH_")},
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "PYTHON": sys.executable,
        **env,
    }
    return subprocess.run(
        ["bash", "-c", f"source scripts/install.sh && {FAKE_PIP} && {script}"],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def no_gpu():
    if Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA GPU")


@pytest.fixture
def cpu_index():
    """A package index that answers (its pages need not hold torch: only whether it answers is checked)."""

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
        server.shutdown()


def refusing_url() -> str:
    """An address where nothing listens: the connection is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"


def test_without_a_gpu_torch_comes_from_the_cpu_index(tmp_path, no_gpu, cpu_index):
    done = run_sourced("install_torch pip install", tmp_path, TORCH_CPU_INDEX=cpu_index)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pip", "install", "--index-url", cpu_index, "torch==2.13.0"]
    assert f"no NVIDIA GPU here: torch's CPU build, from {cpu_index}" in done.stderr


def test_a_cpu_index_that_does_not_answer_falls_back_to_the_default_index_with_a_note(tmp_path, no_gpu):
    url = refusing_url()
    done = run_sourced("install_torch pip install", tmp_path, TORCH_CPU_INDEX=url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pip", "install", "torch==2.13.0"]  # pip's own index (and find-links)
    assert f"{url} does not answer: torch from pip's default index and find-links instead" in done.stderr
    assert "TORCH_INDEX=URL" in done.stderr


def test_with_an_nvidia_gpu_torch_comes_from_the_default_index(tmp_path, cpu_index):
    (tmp_path / "bin").mkdir()
    nvidia_smi = tmp_path / "bin" / "nvidia-smi"
    nvidia_smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    nvidia_smi.chmod(0o755)
    done = run_sourced("install_torch pip install", tmp_path, TORCH_CPU_INDEX=cpu_index)
    assert done.stdout.split() == ["pip", "install", "torch==2.13.0"]
    assert "an NVIDIA GPU is here: torch from the default index" in done.stderr


def test_torch_index_names_the_index(tmp_path):
    done = run_sourced("install_torch pip install", tmp_path, TORCH_INDEX="https://mirror.example/whl/cpu")
    assert done.stdout.split() == [
        "pip",
        "install",
        "--index-url",
        "https://mirror.example/whl/cpu",
        "torch==2.13.0",
    ]
    assert "torch from TORCH_INDEX=https://mirror.example/whl/cpu" in done.stderr


def test_it_says_which_build_it_installed(tmp_path):
    fake = tmp_path / "cuda-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import types\n__version__ = '2.13.0+cu130'\nversion = types.SimpleNamespace(cuda='13.0')\n"
    )
    cpu = run_sourced(f"say_torch_build {sys.executable}", tmp_path)
    assert cpu.stderr.strip() == f"install: torch {torch_version()} installed: the CPU build", cpu.stderr
    cuda = run_sourced(f"say_torch_build {sys.executable}", tmp_path, PYTHONPATH=str(fake.parent))
    assert cuda.stderr.strip() == "install: torch 2.13.0+cu130 installed: the CUDA 13.0 build", cuda.stderr


def torch_version() -> str:
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    return done.stdout.strip()


# ---------------------------------------------------------------- what it says it installs, and progress


def report(tmp_path: Path, version: str, url: str) -> Path:
    """A `pip install --dry-run --report -` answer choosing torch `version` from `url`."""
    path = tmp_path / "report.json"
    chosen = [{"metadata": {"name": "torch", "version": version}, "download_info": {"url": url}}]
    path.write_text(json.dumps({"version": "1", "install": chosen}))
    return path


def test_it_says_which_wheel_pip_chose_before_installing_it(tmp_path):
    """What the set-up log said was what pip did: a CPU wheel from pip's find-links was announced as PyPI's CUDA
    build. The wheel pip resolves is what it names now."""
    local = report(
        tmp_path, "2.13.0+cpu", "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl"
    )
    done = run_sourced(
        "install_torch pip install", tmp_path, TORCH_INDEX="https://x.example", REPORT=str(local)
    )
    assert done.returncode == 0, done.stderr
    said = done.stderr.splitlines()
    wheel = "install: torch 2.13.0+cpu from the local file /opt/wheels/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    assert f"{wheel}: the CPU build" in said, said
    assert said.index(f"{wheel}: the CPU build") < said.index(
        "install: installing torch==2.13.0 (the largest package: a minute or more)"
    )
    pypi = report(
        tmp_path, "2.13.0", "https://files.pythonhosted.org/packages/torch-2.13.0-cp311-linux_x86_64.whl"
    )
    done = run_sourced(
        "install_torch pip install", tmp_path, TORCH_INDEX="https://x.example", REPORT=str(pypi)
    )
    assert (
        "install: torch 2.13.0 from files.pythonhosted.org: its default build: on Linux x86_64 the CUDA build"
        in done.stderr
    )
    (tmp_path / "nothing.json").write_text(json.dumps({"version": "1", "install": []}))
    done = run_sourced("install_torch pip install", tmp_path, TORCH_INDEX="https://x.example",
                       REPORT=str(tmp_path / "nothing.json"))  # fmt: skip
    assert "install: torch==2.13.0 is installed already" in done.stderr and "largest" not in done.stderr


def test_a_long_step_says_it_is_still_under_way(tmp_path):
    done = run_sourced(
        'with_progress "installing torch" sleep 2.5 && echo finished', tmp_path, PROGRESS_SECONDS="1"
    )
    assert done.returncode == 0 and done.stdout.strip() == "finished", done.stderr
    assert "install: installing torch: still under way (1 s)" in done.stderr
    assert "install: installing torch: still under way (2 s)" in done.stderr
    failed = run_sourced('with_progress "x" false', tmp_path)
    assert failed.returncode == 1


def test_an_environment_with_more_extras_needs_nothing_more(tmp_path):
    """The tests' environment (server,samples,train,...) serves `bash scripts/serve.sh` (server,samples) as it is."""
    (tmp_path / ".venv").mkdir()
    (tmp_path / "clients" / "python").mkdir(parents=True)
    for name in ("pyproject.toml", "clients/python/pyproject.toml"):
        (tmp_path / name).write_text("")
    os.utime(tmp_path / "pyproject.toml", (1, 1))
    os.utime(tmp_path / "clients/python/pyproject.toml", (1, 1))
    (tmp_path / ".venv" / ".txl-installed-server,samples,dev").write_text("")
    script = (
        f"source {REPO / 'scripts' / 'install.sh'} && cd {tmp_path} && "
        "for want in server server,samples samples,dev server,train; do "
        'installed_already "$want" && echo "$want: yes" || echo "$want: no"; done'
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.stdout.split("\n")[:4] == [
        "server: yes",
        "server,samples: yes",
        "samples,dev: yes",
        "server,train: no",
    ]
    os.utime(tmp_path / "pyproject.toml", None)  # pyproject.toml changed since: install again
    again = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert again.stdout.split("\n")[:2] == ["server: no", "server,samples: no"]
