"""The bundled model's figures, drawn from its measurements: bits per byte against memory length (the books of
`python -m txl.training.evaluate`'s report) and the training curve per held-out genre. The model card
(scripts/model_card.py), the quality benchmark (`python -m bench quality`) and `python -m txl.training.loss_curve`
draw them from here.

Needs matplotlib (the `train` extra), imported when a figure is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def memory_plot(books: dict[str, dict[str, Any]], out: Path) -> None:
    """Each book's held-out bits per byte against mem_len, and xz -9e's (dotted) for scale."""
    fig, ax = _figure()
    for name, book in books.items():
        mem_lens = sorted(int(m) for m in book["bpb"])
        ax.plot(mem_lens, [book["bpb"][str(m)] for m in mem_lens], "o-", label=name)
        ax.axhline(book["xz_9e"], linestyle=":", color=ax.lines[-1].get_color(), alpha=0.7)
    ax.set_xlabel("mem_len (bytes of memory)")
    ax.set_ylabel("held-out bits per byte (dotted: xz -9e)")
    ax.set_xscale("symlog", linthresh=128)
    _save(fig, ax, out)


def loss_plot(records: list[dict[str, Any]], out: Path) -> None:
    """The training log's running train bits per byte, and the held-out bits per byte at every validation: each
    genre's where the log has them, else the one validation set's."""
    by_genre = any("valid_bpb_by_genre" in r for r in records)
    points = [r for r in records if ("valid_bpb_by_genre" if by_genre else "valid_bpb") in r]
    fig, ax = _figure()
    steps = [p["step"] for p in points]
    ax.plot(steps, [p["train_bpb"] for p in points], label="train (running mean)", color="black")
    if by_genre:
        for genre in points[-1]["valid_bpb_by_genre"]:
            values = [p["valid_bpb_by_genre"][genre] for p in points]
            ax.plot(steps, values, label=f"validation: {genre}")
    else:
        ax.plot(steps, [p["valid_bpb"] for p in points], label="validation (held-out text)")
    ax.set_xlabel("step (16 streams x 128 bytes)")
    ax.set_ylabel("bits per byte")
    _save(fig, ax, out)


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6.4, 3.8))


def _save(fig: Any, ax: Any, out: Path) -> None:
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
