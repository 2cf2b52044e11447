"""docs/benchmarks.md, written section by section: a benchmark suite's (or `check --write-benchmarks`') tables and
notes as Markdown, saved as docs/benchmarks/NAME.md and assembled into docs/benchmarks.md in a fixed order. Every
`bench` suite writes through this, and so does the check, which is why it lives in the package."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch


def machine() -> str:
    """One line naming where absolute times came from."""
    cpu = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
            if cpu and flags:
                break
    except OSError:
        pass
    # The same model name comes with and without AVX-512 on these machines, and it changes matmul rates several
    # times over (docs/benchmarks/engine-figures.md).
    if "avx512_bf16" in flags:
        cpu += " (AVX-512, bf16)"
    elif "avx512f" in flags:
        cpu += " (AVX-512)"
    elif "avx2" in flags:
        cpu += " (AVX2)"
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads){gpu}"
    )


@dataclass
class Section:
    """One suite's results: a title, prose, tables; rendered to Markdown and printed."""

    name: str
    title: str
    command: str
    notes: list[str] = field(default_factory=list)
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    # Drawn where the section is saved: (file name, a function that writes the figure to a path).
    figures: list[tuple[str, Callable[[Path], None]]] = field(default_factory=list)
    # Named when the section starts: a suite that sets its own thread count restores it before rendering.
    machine: str = field(default_factory=machine)

    def table(self, caption: str, header: list[str], rows: list[list[object]]) -> None:
        self.tables.append((caption, header, [[_fmt(c) for c in row] for row in rows]))
        print(f"\n{caption}")
        widths = [max(len(h), *(len(r[i]) for r in self.tables[-1][2])) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        for row in self.tables[-1][2]:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(text)

    def markdown(self) -> str:
        out = [f"## {self.title}", "", f"Command: `{self.command}`. Machine: {self.machine}.", ""]
        for text in self.notes:
            out += [text, ""]
        for caption, header, rows in self.tables:
            out += [f"**{caption}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            out += ["| " + " | ".join(row) + " |" for row in rows]
            out.append("")
        for image in self.images:
            out += [f"![{self.title}](benchmarks/{image})", ""]
        return "\n".join(out)

    def figure(self, name: str, draw: Callable[[Path], None]) -> None:
        """A figure of the section, drawn by `draw(path)` beside the section's Markdown when it is saved."""
        self.figures.append((name, draw))
        self.images.append(name)

    def save(self, docs: Path) -> None:
        """Writes it as `docs`/benchmarks/NAME.md, its figures beside it."""
        sections = docs / "benchmarks"
        sections.mkdir(parents=True, exist_ok=True)
        for name, draw in self.figures:
            draw(sections / name)
        (sections / f"{self.name}.md").write_text(self.markdown() + "\n", encoding="utf-8")


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value != value:
            return "–"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


ORDER = [
    "model",
    "paper",
    "floor",
    "cpu",
    "cpu-avx512",
    "cpu-avx2",
    "engine",
    "batching",
    "http",
    "tracing",
    "stream",
    "memory",
    "persistence",
    "chained",
    "prefix",
    "memories",
    "responses",
    "handoff",
    "quality",
    "speedwork",
    "host",
    "turns",
    "load",
    "load-tools",
    "gpu",
    "gpu_estimate",
    "gpu_kernels",
]


def assemble(docs: Path) -> Path:
    """`docs`/benchmarks.md from every saved section, in a fixed order."""
    parts = [
        "# Benchmarks",
        "",
        "Every figure here is reproduced by `python -m bench` (all suites, under 15 minutes on a 2-core CPU) or",
        "`python -m bench SUITE`, which write to results/; `--docs` writes here. Ratios are measured side by side",
        "in one run; absolute times are labelled with the machine they came from. Sections are regenerated",
        "independently.",
        "",
    ]
    sections = docs / "benchmarks"
    names = sorted(
        (p.stem for p in sections.glob("*.md")), key=lambda n: (ORDER.index(n) if n in ORDER else 99, n)
    )
    for name in names:
        parts.append((sections / f"{name}.md").read_text(encoding="utf-8"))
    path = docs / "benchmarks.md"
    docs.mkdir(parents=True, exist_ok=True)  # (a results folder where nothing was measured yet)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
