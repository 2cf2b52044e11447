"""Quality against memory: the bundled model's held-out bits per byte for mem_len 0 ... 1,024.

Figures from the model card's evaluation (`python -m txl.training.evaluate`, data in docs/default-model.json): each
held-out book scored as one stream with the given memory length. Longer memory lowers the loss, the paper's
central claim, shown here on our own model.
"""

from __future__ import annotations

import json

from .common import DOCS, Section


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
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return section
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, book in report["books"].items():
        ax.plot(mem_lens, [book["bpb"][str(m)] for m in mem_lens], "o-", label=f"{name} ({book['split']})")
        ax.axhline(book["xz_9e"], linestyle=":", color=ax.lines[-1].get_color(), alpha=0.6)
    ax.set_xlabel("mem_len (bytes of memory)")
    ax.set_ylabel("bits per byte (dotted: xz -9e)")
    ax.set_xscale("symlog", linthresh=128)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    (DOCS / "benchmarks").mkdir(parents=True, exist_ok=True)
    fig.savefig(DOCS / "benchmarks" / "quality_memory.png", dpi=120)
    plt.close(fig)
    section.images.append("quality_memory.png")
    return section
