"""scripts/gpu-check.sh, the pieces a machine without a GPU runs: it stops at once, saying so, where there is no
GPU or a Python package is missing; with --wheels it installs the wheels whose distributions the Python lacks
(a bare GPU host: torch and Triton alone, no network); with a stand-in Python that claims a GPU (and runs nothing),
it runs bench gpu, then check, with their time limits, writes what each printed, the environment and a summary
under its output directory, and fails a step that runs out of time; `python -m bench gpu --out DIR` writes there,
not into the repository's docs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"

# A Python that claims a GPU and records what it is asked to run; `bench gpu` sleeps past its limit.
STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$1" in
    -c) case "$2" in *get_device_name*) echo "Stand-in H100";; *) echo "torch stand-in";; esac;;
    -m) if [ "$2" = bench ]; then sleep 30; else echo "every check passed"; fi;;
esac
"""


def _run(tmp_path: Path, python: str, *arguments: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *arguments],
        env={**os.environ, "PYTHON": python, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_a_gpu_it_stops_at_once_saying_so_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    done = _run(tmp_path, sys.executable, str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "gpu-check: no CUDA device here (torch " in done.stderr and "nothing was run" in done.stderr
    assert not out.exists()


def test_it_runs_bench_gpu_then_check_with_their_limits_and_writes_their_figures(tmp_path):
    """bench gpu first: its kernels' figures within a minute, even when a later step fails."""
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    calls, out = tmp_path / "calls", tmp_path / "out"
    done = _run(tmp_path, str(python), str(out), CALLS=str(calls), BENCH_SECONDS="1", TXL_DEVICE="cpu")
    assert done.returncode == 1, done.stdout + done.stderr  # bench gpu ran out of time
    ran = [line for line in calls.read_text().splitlines() if line.startswith("-m")]
    assert ran == [
        f"-m bench gpu --out {out}/bench",
        f"-m txl_server check --device cuda --dtype bfloat16 --write-benchmarks --docs {out}/check",
    ]
    assert (out / "check.txt").read_text() == "every check passed\n"
    assert "device: Stand-in H100" in (out / "environment.txt").read_text()
    summary = (out / "summary.txt").read_text().splitlines()
    assert re.fullmatch(r"bench-gpu: exit 124 in \d+ s \(out of time: 1 s\)", summary[0]), summary
    assert re.fullmatch(r"check: exit 0 in \d+ s", summary[1]), summary
    assert "a step FAILED" in done.stdout


def test_its_time_limits_fit_in_ten_minutes():
    text = SCRIPT.read_text()
    limits = [int(x) for x in re.findall(r"_SECONDS:-(\d+)\}", text)]
    kill_after = int(re.search(r"--kill-after=(\d+)", text).group(1))
    assert len(limits) == 3 and sum(limits) + len(limits) * kill_after <= 590


def _wheel(folder: Path, distribution: str, module: str) -> Path:
    """A minimal pure-Python wheel of `distribution`, holding `module` (which says its name)."""
    path = folder / f"{distribution}-1.0-py3-none-any.whl"
    info = f"{distribution}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{module}.py", f"NAME = {module!r}\n")
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_with_wheels_it_installs_what_the_python_lacks_and_nothing_it_has(tmp_path):
    """Review round 3, finding 5: as shipped, a bare GPU host (torch and Triton alone) could not start the run."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "txl_gpu_check_probe", "txl_gpu_check_probe")
    _wheel(wheels, "numpy", "numpy_impostor")  # numpy is here: its wheel is left alone
    done = _run(tmp_path, sys.executable, "--wheels", str(wheels), str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr  # then no GPU: nothing measured
    assert f"installed 1 wheel(s) from {wheels}: txl_gpu_check_probe-1.0-py3-none-any.whl" in done.stdout
    assert "gpu-check: no CUDA device here" in done.stderr and not (tmp_path / "out").exists()


# A Python without fastapi (a host that has torch and Triton, and not the server's packages).
WITHOUT_FASTAPI = """import sys
class Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "fastapi_offline"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name.split(".")[0])
sys.meta_path.insert(0, Hidden())
"""


def test_a_missing_package_is_named_at_once_before_anything_runs(tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(WITHOUT_FASTAPI)
    path = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH", "")) if p)
    done = _run(tmp_path, sys.executable, str(tmp_path / "out"), PYTHONPATH=path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "gpu-check: missing Python packages: fastapi" in done.stderr
    assert "--wheels DIR" in done.stderr and not (tmp_path / "out").exists()


def test_bench_gpu_writes_into_the_docs_it_is_given_and_measures_nothing_without_a_gpu(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench", "gpu", "--out", str(tmp_path / "new")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no CUDA device here" in done.stdout
    out = tmp_path / "new"  # a results folder not made yet (as scripts/gpu-check.sh passes it)
    assert (out / "benchmarks.md").exists() and not (out / "benchmarks" / "gpu.md").exists()
    assert f"wrote {out / 'benchmarks.md'}" in done.stdout
