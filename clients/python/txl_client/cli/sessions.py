"""Commands for sessions: `txl sessions ls | show ID | rm ID... | new [TEXT] [--memory ID]`, and the history
commands (history.py)."""

from __future__ import annotations

import argparse
import sys

from . import history
from .actions import add_ls_show_rm
from .connection import make_client
from .exits import UsageError
from .output import describe, print_list, print_made


def add_sessions(parser: argparse.ArgumentParser, connection: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(title="actions", metavar="ACTION")
    runs = (sessions_ls, sessions_show, sessions_rm)
    add_ls_show_rm(
        actions, connection, noun="session", plural="sessions", runs=runs, rm_help="delete sessions"
    )
    new = actions.add_parser("new", help="start a session (--memory ID: from a memory)", parents=[connection])
    new.add_argument("text", nargs="?", default="", help='text the session starts with ("-": standard input)')
    new.add_argument("--memory", metavar="ID", help="start from this memory (as if its document came first)")
    new.add_argument("--json", action="store_true", help="print the session as JSON")
    new.set_defaults(run=sessions_new)
    history.add_history(actions, connection)


def sessions_help(args: argparse.Namespace) -> int:
    raise UsageError(
        "give an action: txl sessions ls | show ID | rm ID... | new | history ID | rewind ID N | fork ID"
    )


SESSION_ROW = "{id:<{width}} {tokens:>8} {memory:>11} {version:>7}  {expires}"


def sessions_ls(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        sessions = client.list_sessions()
    return print_list(
        sessions, SESSION_ROW, as_json=args.json, none="no sessions", order=lambda s: s.created_at
    )


def sessions_show(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        print(client.get_session(args.session_id).model_dump_json(indent=2))
    return 0


def sessions_rm(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        for session_id in args.session_ids:
            client.delete_session(session_id)
            print(f"deleted {session_id}")
    return 0


def sessions_new(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    with make_client(args) as client:
        session = client.create_session(text, memory=args.memory)
    return print_made(session, describe(session), as_json=args.json)
