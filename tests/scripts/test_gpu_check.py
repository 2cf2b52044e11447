"""scripts/gpu-check.sh, the pieces a machine without a GPU runs: it stops at once, saying so, where there is no
GPU; with a stand-in Python that claims one (and runs nothing), it runs check and bench gpu with their time limits,
writes what each printed, the environment and a summary under its output directory, and fails a step that runs out
of time; `python -m bench gpu --out DIR` writes there, not into the repository's docs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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


def test_it_runs_check_and_bench_gpu_with_their_limits_and_writes_their_figures(tmp_path):
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    calls, out = tmp_path / "calls", tmp_path / "out"
    done = _run(tmp_path, str(python), str(out), CALLS=str(calls), BENCH_SECONDS="1", TXL_DEVICE="cpu")
    assert done.returncode == 1, done.stdout + done.stderr  # bench gpu ran out of time
    ran = [line for line in calls.read_text().splitlines() if line.startswith("-m")]
    assert ran == [
        f"-m txl_server check --device cuda --dtype bfloat16 --write-benchmarks --docs {out}/check",
        f"-m bench gpu --out {out}/bench",
    ]
    assert (out / "check.txt").read_text() == "every check passed\n"
    assert "device: Stand-in H100" in (out / "environment.txt").read_text()
    summary = (out / "summary.txt").read_text().splitlines()
    assert re.fullmatch(r"check: exit 0 in \d+ s", summary[0]), summary
    assert re.fullmatch(r"bench-gpu: exit 124 in \d+ s \(out of time: 1 s\)", summary[1]), summary
    assert "a step FAILED" in done.stdout


def test_its_time_limits_fit_in_ten_minutes():
    text = SCRIPT.read_text()
    limits = [int(x) for x in re.findall(r"_SECONDS:-(\d+)\}", text)]
    kill_after = int(re.search(r"--kill-after=(\d+)", text).group(1))
    assert len(limits) == 2 and sum(limits) + len(limits) * kill_after <= 590


def test_bench_gpu_writes_into_the_docs_it_is_given_and_measures_nothing_without_a_gpu(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench", "gpu", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no CUDA device here" in done.stdout
    assert (tmp_path / "benchmarks.md").exists() and not (tmp_path / "benchmarks" / "gpu.md").exists()
    assert f"wrote {tmp_path / 'benchmarks.md'}" in done.stdout
