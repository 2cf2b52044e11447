"""How a `txl` command ends: its exit status, and the one line that says what went wrong."""

from __future__ import annotations

from ..errors import TxlConnectionError, TxlError, TxlTimeoutError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """A problem with what the user asked for (exit status 2), found after argument parsing."""


# Where no server answers at the address: which is the usual first error of all.
NO_SERVER_HINT = (
    "is a server running there? Start one with `bash scripts/serve.sh` (or `txl serve`), or give its address "
    "with --url or TXL_URL"
)


def error_line(exc: TxlError, where: str = "") -> str:
    """`txl: error: [where: ]<the error>`, with a hint where one helps."""
    if isinstance(exc, TxlTimeoutError):
        hint = " (wait longer with --timeout SECONDS)"
    elif isinstance(exc, TxlConnectionError) and not exc.sent:
        hint = f"\n  {NO_SERVER_HINT}"
    else:
        hint = ""
    return f"txl: error: {where + ': ' if where else ''}{exc}{hint}"
