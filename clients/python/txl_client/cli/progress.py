"""A progress bar on stderr while the server reads a long text, and the flags that turn it on or off."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO


def add_progress(parser: argparse.ArgumentParser, what: str) -> None:
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        action="store_true",
        default=None,
        help=f"always show {what} on stderr (default: on a terminal)",
    )
    progress.add_argument("--no-progress", dest="progress", action="store_false", help=f"never show {what}")


def shows_progress(args: argparse.Namespace) -> bool:
    """--progress, --no-progress, else whether stderr is a terminal."""
    return sys.stderr.isatty() if args.progress is None else bool(args.progress)


class ProgressBar:
    """One line on a terminal, redrawn at most 10 times a second: `name [#####-----] 50% 1200/2400 tokens`."""

    WIDTH = 30

    def __init__(self, name: str, stream: TextIO) -> None:
        self.name, self.stream = name, stream
        self.last = 0.0
        self.drawn = False

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        filled = self.WIDTH * done // total if total else self.WIDTH
        percent = 100 * done // total if total else 100
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r{self.name} [{bar}] {percent:3d}% {done}/{total} tokens")
        self.stream.flush()
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K" if self.stream.isatty() else "\n")
            self.stream.flush()
