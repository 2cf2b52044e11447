"""Shared benchmark machinery: timing, peak RSS, percentiles, where the docs are, a past revision's tree.
(The Markdown sections every suite writes, and the machine line they carry: txl_server.check.benchmark_docs.)"""

from __future__ import annotations

import resource
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SECTIONS = DOCS / "benchmarks"
RESULTS = ROOT / "results"  # where `python -m bench` writes unless told `--docs`


def timeit(fn: Callable[[], object], *, repeat: int = 5, warmup: int = 1, min_seconds: float = 0.0) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    times = []
    started = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def export_revision(revision: str, into: Path) -> Path:
    """The tree at `revision` of this repository, written under `into` (for timing code against what it
    replaced, in the same run)."""
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, check=True, capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into
