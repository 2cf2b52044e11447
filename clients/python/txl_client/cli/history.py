"""A session's history on the command line: `txl sessions history ID`, `txl sessions rewind ID N` and
`txl sessions fork ID [--version N]`."""

from __future__ import annotations

import argparse
import json

from .connection import make_client
from .output import describe, when

TAIL_WIDTH = 40


def add_history(actions: argparse._SubParsersAction, connection: argparse.ArgumentParser) -> None:
    history = actions.add_parser(
        "history", help="the versions a session keeps, newest first", parents=[connection]
    )
    history.add_argument("session_id", metavar="ID", help="the session's id (`txl sessions ls` lists them)")
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(run=sessions_history)
    rewind = actions.add_parser(
        "rewind",
        help="continue a session from one of its versions (itself a new version)",
        parents=[connection],
    )
    rewind.add_argument("session_id", metavar="ID", help="the session's id")
    rewind.add_argument("version", metavar="N", type=int, help="a version `txl sessions history ID` lists")
    rewind.set_defaults(run=sessions_rewind)
    fork = actions.add_parser(
        "fork", help="a new session from a session (its newest or a kept version)", parents=[connection]
    )
    fork.add_argument("session_id", metavar="ID", help="the id of the session to fork (it stays as it is)")
    fork.add_argument("--version", type=int, metavar="N", help="fork this kept version (default: the newest)")
    fork.set_defaults(run=sessions_fork)


def sessions_history(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        versions = client.versions(args.session_id)
    if args.json:
        print(json.dumps([v.model_dump() for v in versions], indent=2))
        return 0
    print(f"{'version':>7}  {'kind':<8} {'tokens':>8}  {'when':<23}  text (end)")
    for v in versions:
        print(f"{v.version:>7}  {v.kind:<8} {v.tokens:>8}  {when(v.created_at):<23}  {_tail(v.text_tail)}")
    return 0


def sessions_rewind(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        session = client.rewind(args.session_id, args.version)
    print(f"rewound to version {args.version}: {describe(session)}")
    return 0


def sessions_fork(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        fork = client.fork_session(args.session_id, version=args.version)
    print(fork.id)
    return 0


def _tail(text: str | None) -> str:
    """The step's text, on one line, its last TAIL_WIDTH characters."""
    if not text:
        return ""
    flat = json.dumps(text, ensure_ascii=False)[1:-1]  # newlines and tabs shown as escapes
    return flat if len(flat) <= TAIL_WIDTH else "…" + flat[-(TAIL_WIDTH - 1) :]
