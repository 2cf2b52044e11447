"""Quality against memory: the bundled model's held-out bits per byte for mem_len 0 ... 1,024.

Figures from the model card's evaluation (`python -m txl.training.evaluate`, data in docs/default-model.json): each
held-out book scored as one stream with the given memory length. Longer memory lowers the loss, the paper's
central claim, shown here on our own model.
"""

from __future__ import annotations

import importlib.util
import json

from txl.training.figures import memory_plot
from txl_server.check.benchmark_docs import Section

from .common import DOCS


def run(quick: bool = False) -> Section:
    section = Section("quality", "Quality against memory length (bundled model)", "python -m bench quality")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    path = DOCS / "default-model.json"
    if not path.is_file():
        section.note("docs/default-model.json is missing: run `python -m txl.training.evaluate` first.")
        return section
    report = json.loads(path.read_text())
    mem_lens = sorted({int(m) for book in report["books"].values() for m in book["bpb"]})
    rows = []
    for name, book in report["books"].items():
        rows.append(
            [
                f"{name} ({book['split']})",
                f"{book['bytes']:,}",
                *[book["bpb"].get(str(m), float("nan")) for m in mem_lens],
                book["xz_9e"],
            ]
        )
    section.table(
        "Held-out bits per byte", ["book", "bytes", *[f"mem {m}" for m in mem_lens], "xz -9e"], rows
    )
    if importlib.util.find_spec("matplotlib") is None:  # the `train` extra; without it, no figure
        return section
    section.figure("quality_memory.png", lambda path: memory_plot(report["books"], path))
    return section
