"""`python -m txl.training.loss_curve runs/NAME/log.jsonl out.png`: the training run's loss curve (bits per byte)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(log_path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    points = [r for r in records if "step" in r and "valid_bpb" in r]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot([p["step"] for p in points], [p["train_bpb"] for p in points], label="train (running mean)")
    ax.plot([p["step"] for p in points], [p["valid_bpb"] for p in points], label="validation (held-out book)")
    ax.set_xlabel("step (16 streams x 128 bytes)")
    ax.set_ylabel("bits per byte")
    ax.set_ylim(
        bottom=min(p["valid_bpb"] for p in points) - 0.2, top=min(4.0, max(p["train_bpb"] for p in points))
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    plot(Path(sys.argv[1]), Path(sys.argv[2]))
