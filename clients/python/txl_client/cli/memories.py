"""Commands for preloaded memories: `txl memories add FILE | ls | show ID | rm ID...`, and
`txl sessions new [TEXT] [--memory ID]` (a session that starts from one)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..types import Memory
from . import UsageError, make_client
from .remote import ProgressBar, _read_document, _when, add_progress, describe


def add_memories(parser: argparse.ArgumentParser, connection: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(title="actions", metavar="ACTION")
    add = actions.add_parser(
        "add", help="read a document into a new memory; prints its id", parents=[connection]
    )
    add.add_argument("file", metavar="FILE", type=Path, help='a UTF-8 text file ("-": standard input)')
    add.add_argument("--name", help="your label for it (default: the file's name)")
    add.add_argument("--ttl", type=int, metavar="SECONDS", help="expires this long after creation")
    add.add_argument("--json", action="store_true", help="print the memory as JSON")
    add_progress(add, "how far the server is in reading the document")
    add.set_defaults(run=memories_add)
    ls = actions.add_parser("ls", help="list memories", parents=[connection])
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(run=memories_ls)
    show = actions.add_parser("show", help="show one memory as JSON", parents=[connection])
    show.add_argument("memory_id", metavar="ID")
    show.set_defaults(run=memories_show)
    rm = actions.add_parser(
        "rm", help="delete memories (sessions started from them go on)", parents=[connection]
    )
    rm.add_argument("memory_ids", metavar="ID", nargs="+")
    rm.set_defaults(run=memories_rm)


def memories_help(args: argparse.Namespace) -> int:
    raise UsageError("give an action: txl memories add FILE | ls | show ID | rm ID...")


def memories_add(args: argparse.Namespace) -> int:
    text = _read_document(args.file)
    name = args.name if args.name is not None else (None if str(args.file) == "-" else args.file.name)
    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
    bar = ProgressBar(str(args.file), sys.stderr) if show_progress else None
    with make_client(args) as client:
        try:
            # Always streamed: a long document then reports its progress, which keeps the request from timing
            # out while the server reads it.
            memory = client.memories.create(
                text, name=name, ttl_seconds=args.ttl, on_progress=bar.update if bar else _quiet
            )
        finally:
            if bar is not None:
                bar.clear()
    if args.json:
        print(memory.model_dump_json(indent=2))
        return 0
    print(memory.id)
    print(_describe(memory), file=sys.stderr)
    return 0


def _quiet(done: int, total: int) -> None:
    pass


def memories_ls(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        memories = client.memories.list()
    if args.json:
        print(json.dumps([m.model_dump() for m in memories], indent=2))
        return 0
    if not memories:
        print("no memories", file=sys.stderr)
        return 0
    width = max(len(m.id) for m in memories)
    print(f"{'id':<{width}} {'tokens':>10} {'memory':>11}  {'expires':<23}  name")
    for m in memories:
        memory = f"{m.mem_tokens}/{m.mem_len}"
        print(f"{m.id:<{width}} {m.tokens:>10} {memory:>11}  {_when(m.expires_at):<23}  {m.name or ''}")
    return 0


def memories_show(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        print(client.memories.get(args.memory_id).model_dump_json(indent=2))
    return 0


def memories_rm(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        for memory_id in args.memory_ids:
            client.memories.delete(memory_id)
            print(f"deleted {memory_id}")
    return 0


def _describe(memory: Memory) -> str:
    label = f" ({memory.name})" if memory.name else ""
    return (
        f"memory {memory.id}{label}: {memory.tokens} tokens read, memory {memory.mem_tokens}/{memory.mem_len}, "
        f"expires {_when(memory.expires_at)}"
    )


# ---------------------------------------------------------------------------------------------- sessions new


def add_session_new(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "text", nargs="?", default="", help='text the session starts with ("-": standard input)'
    )
    parser.add_argument(
        "--memory", metavar="ID", help="start from this memory (as if its document came first)"
    )
    parser.add_argument("--json", action="store_true", help="print the session as JSON")
    parser.set_defaults(run=sessions_new)


def sessions_new(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    with make_client(args) as client:
        session = client.create_session(text, memory=args.memory)
    if args.json:
        print(session.model_dump_json(indent=2))
        return 0
    print(session.id)
    print(describe(session), file=sys.stderr)
    return 0
