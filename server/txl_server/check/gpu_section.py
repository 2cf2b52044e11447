"""`python -m txl_server check --write-benchmarks`: the GPU section of docs/benchmarks.md from a check's report,
through the Markdown sections the benchmarks write too (`check.benchmark_docs`)."""

from __future__ import annotations

from pathlib import Path

from .benchmark_docs import Section, assemble
from .report import CheckReport

SECTION = "gpu"


def section(report: CheckReport) -> Section:
    """The section for `report`: parity, graphs and kernel checks, speed."""
    d = report.device
    result = Section(
        SECTION,
        f"GPU: `python -m txl_server check` on {d.device_name}",
        "python -m txl_server check --device cuda --write-benchmarks",
    )
    result.note(
        "The configured model on the configured device, through the server's own worker: parity of the engine "
        "against the model's hidden-state path (HF's function) on the session window grid, the start-up checks "
        "(attention kernel against the torch path, every CUDA graph against eager), and speed against the "
        "memory-bandwidth floor measured in the same run (the bytes a decoding step reads, the weights once and "
        "each session's keys and values at the served mem_len, over a device copy's bandwidth)."
    )
    path = d.decode_path
    result.note(
        f"Decode path: attention {path.attention}, prompt attention {path.prefill}, layers {path.layers}, linear "
        f"{'/'.join(path.linear)}, embedding {path.embedding}, softmax {path.softmax}, sampler {path.sampler}, "
        f"graphs {path.graphs}."
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
            f"Speed ({d.dtype}, attention {d.attention}, CUDA graphs {d.cuda_graphs}, memories of {speed.mem:,})",
            ["what", "tokens/s", "ms per step", "floor (ms)", "x floor"],
            [
                ["decode, 1 session", 1 / speed.decode_one, speed.decode_one * 1000, speed.floor_one * 1000,
                 speed.decode_one / speed.floor_one],
                [f"decode, {speed.batch} sessions", speed.batch / speed.decode_batch, speed.decode_batch * 1000,
                 speed.floor_batch * 1000, speed.decode_batch / speed.floor_batch],
                [f"scoring {speed.document:,} tokens", speed.scoring, float("nan"), float("nan"),
                 speed.scoring_floor / speed.scoring],
            ],
        )  # fmt: skip
    return result


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # |delta log p| would end a Markdown table's cell


def write_section(report: CheckReport, docs: Path) -> Path:
    """Saves the section under `docs` and reassembles its benchmarks.md; returns that file's path."""
    section(report).save(docs)
    return assemble(docs)


def repository_docs() -> Path:
    """The repository's docs directory: the command runs from the repository root (where bench/ is)."""
    root = Path.cwd()
    if not (root / "bench").is_dir():  # an installed server, run elsewhere
        raise RuntimeError("--write-benchmarks runs from the repository root (where bench/ is)")
    return root / "docs"
