"""The text files a command reads (`txl score FILE`, `txl memories add FILE`)."""

from __future__ import annotations

import sys
from pathlib import Path

from .exits import UsageError


def read_document(path: Path) -> str:
    """A non-empty UTF-8 file ("-": standard input); else a UsageError saying what is wrong with it."""
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start})") from exc
    if not text:
        raise UsageError(f"{path} is empty")
    return text
