"""The flags that say which server a command talks to, and the client made from them."""

from __future__ import annotations

import argparse

from ..client import Client


def connection_flags() -> argparse.ArgumentParser:
    """A parent parser of --url, --api-key and --timeout. The flags go before or after the command
    (`txl --url U sessions ls`, `txl sessions ls --url U`): they have no defaults in the namespace
    (argparse.SUPPRESS), so that a flag given before the command is not overwritten by the command's own parser."""
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument(
        "--url", default=argparse.SUPPRESS, help="server URL (TXL_URL, default http://127.0.0.1:8000)"
    )
    connection.add_argument("--api-key", default=argparse.SUPPRESS, help="API key (TXL_API_KEY)")
    connection.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS,
        help="seconds to wait for the server to answer or report progress (default 60)",
    )
    return connection


def make_client(args: argparse.Namespace) -> Client:
    """A client by the connection flags; unset means "the environment, else the default"."""
    return Client(
        getattr(args, "url", None), getattr(args, "api_key", None), timeout=getattr(args, "timeout", 60.0)
    )
