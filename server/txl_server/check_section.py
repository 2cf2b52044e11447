"""`python -m txl_server check --write-benchmarks`: the GPU section of docs/benchmarks.md from a check's report,
through the benchmarks' own section mechanism (`bench.common`, in the repository, not in the installed package)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .check import CheckReport

SECTION = "gpu"


def section(report: CheckReport) -> Any:
    """The section (a `bench.common.Section`) for `report`: parity, graphs and kernel checks, speed."""
    d = report.device
    result = _bench().Section(
        SECTION,
        f"GPU: `python -m txl_server check` on {d.device_name}",
        "python -m txl_server check --device cuda --write-benchmarks",
    )
    result.note(
        "The configured model on the configured device, through the server's own worker: parity of the engine "
        "against the model's hidden-state path (HF's function) on the session window grid, the start-up checks "
        "(attention kernel against the torch path, every CUDA graph against eager), and speed against the "
        "memory-bandwidth floor measured in the same run (weight bytes per decoding step over a device copy's "
        "bandwidth)."
    )
    result.table(
        "Checks",
        ["check", "result", "passes"],
        [
            [line.name, _cell(line.text), {True: "yes", False: "NO", None: ""}[line.ok]]
            for line in report.lines
        ],
    )
    speed = report.speed
    if speed is not None:
        result.table(
            f"Speed ({d.dtype}, attention {d.attention}, CUDA graphs {d.cuda_graphs})",
            ["what", "tokens/s", "ms per step", "floor (ms)", "x floor"],
            [
                ["decode, 1 session", 1 / speed.decode_one, speed.decode_one * 1000, speed.floor_one * 1000,
                 speed.decode_one / speed.floor_one],
                [f"decode, {speed.batch} sessions", speed.batch / speed.decode_batch, speed.decode_batch * 1000,
                 speed.floor_one * 1000, speed.decode_batch / speed.floor_one],
                [f"scoring {speed.document:,} tokens", speed.scoring, float("nan"), float("nan"),
                 speed.scoring_floor / speed.scoring],
            ],
        )  # fmt: skip
    return result


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # |delta log p| would end a Markdown table's cell


def write_section(report: CheckReport) -> Path:
    """Saves the section and reassembles docs/benchmarks.md; returns its path."""
    section(report).save()
    path: Path = _bench().assemble()
    return path


def _bench() -> ModuleType:
    """`bench.common`, imported by name: it is the repository's, not the package's (nor the type checker's)."""
    try:
        return importlib.import_module("bench.common")
    except ImportError as exc:  # an installed server without the repository
        raise RuntimeError("--write-benchmarks runs from the repository root (where bench/ is)") from exc
