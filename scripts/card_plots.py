"""The model card's two figures: the training curve per held-out genre, and bits per byte against memory length."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after choosing the file backend


def loss_plot(records: list[dict], out: Path) -> None:
    points = [r for r in records if "valid_bpb_by_genre" in r]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    steps = [p["step"] for p in points]
    ax.plot(steps, [p["train_bpb"] for p in points], label="train (running mean)", color="black")
    for genre in points[-1]["valid_bpb_by_genre"]:
        values = [p["valid_bpb_by_genre"][genre] for p in points]
        ax.plot(steps, values, label=f"validation: {genre}")
    ax.set_xlabel("step (16 streams x 128 bytes)")
    ax.set_ylabel("bits per byte")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def memory_plot(books: dict[str, dict], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for genre, book in books.items():
        mem_lens = sorted(int(m) for m in book["bpb"])
        ax.plot(mem_lens, [book["bpb"][str(m)] for m in mem_lens], "o-", label=genre)
        ax.axhline(book["xz_9e"], linestyle=":", color=ax.lines[-1].get_color(), alpha=0.7)
    ax.set_xlabel("mem_len (bytes of memory)")
    ax.set_ylabel("held-out bits per byte (dotted: xz -9e)")
    ax.set_xscale("symlog", linthresh=128)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
