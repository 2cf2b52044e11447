"""How a `txl` command ends: its exit status, and the one line that says what went wrong."""

from __future__ import annotations

from ..errors import TxlError, TxlTimeoutError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """A problem with what the user asked for (exit status 2), found after argument parsing."""


def error_line(exc: TxlError, where: str = "") -> str:
    """`txl: error: [where: ]<the error>`, with a hint where one helps."""
    hint = " (wait longer with --timeout SECONDS)" if isinstance(exc, TxlTimeoutError) else ""
    return f"txl: error: {where + ': ' if where else ''}{exc}{hint}"
