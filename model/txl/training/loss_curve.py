"""`python -m txl.training.loss_curve runs/NAME/log.jsonl out.png`: the training run's loss curve (bits per byte)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .figures import loss_plot


def plot(log_path: Path, out: Path) -> None:
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    loss_plot(records, out)


if __name__ == "__main__":
    plot(Path(sys.argv[1]), Path(sys.argv[2]))
