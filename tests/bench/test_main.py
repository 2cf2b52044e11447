"""`python -m bench`: sections (and their figures) go to a results folder unless `--docs` says docs/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_suite_writes_to_the_results_folder_and_leaves_the_docs_alone(tmp_path):
    pytest.importorskip("matplotlib")
    committed = ROOT / "docs" / "benchmarks" / "quality.md"
    before = committed.read_bytes(), committed.stat().st_mtime_ns
    run = bench("quality", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert (committed.read_bytes(), committed.stat().st_mtime_ns) == before
    section = (tmp_path / "benchmarks" / "quality.md").read_text()
    assert "](benchmarks/quality_memory.png)" in section
    assert (tmp_path / "benchmarks" / "quality_memory.png").read_bytes().startswith(b"\x89PNG")
    assert section in (tmp_path / "benchmarks.md").read_text()


def test_the_results_folder_is_the_default_and_docs_is_asked_for():
    from bench.__main__ import parser

    assert parser().parse_args(["http"]).out == ROOT / "results"
    assert parser().parse_args(["http", "--docs"]).out == ROOT / "docs"
    with pytest.raises(SystemExit):
        parser().parse_args(["http", "--docs", "--out", "x"])
