"""Commands for preloaded memories: `txl memories add FILE | ls | show ID | rm ID...`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..types import Memory
from .actions import add_ls_show_rm
from .connection import make_client
from .documents import read_document
from .exits import UsageError
from .output import print_list, print_made, when
from .progress import ProgressBar, add_progress, shows_progress


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
    add_ls_show_rm(
        actions,
        connection,
        noun="memory",
        plural="memories",
        runs=(memories_ls, memories_show, memories_rm),
        rm_help="delete memories (sessions started from them go on)",
    )


def memories_help(args: argparse.Namespace) -> int:
    raise UsageError("give an action: txl memories add FILE | ls | show ID | rm ID...")


def memories_add(args: argparse.Namespace) -> int:
    text = read_document(args.file)
    name = args.name if args.name is not None else (None if str(args.file) == "-" else args.file.name)
    bar = ProgressBar(str(args.file), sys.stderr) if shows_progress(args) else None
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
    return print_made(memory, _describe(memory), as_json=args.json)


def _quiet(done: int, total: int) -> None:
    pass


MEMORY_ROW = "{id:<{width}} {tokens:>10} {memory:>11}  {expires:<23}  {name}"


def memories_ls(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        memories = client.memories.list()
    return print_list(memories, MEMORY_ROW, as_json=args.json, none="no memories")


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
        f"expires {when(memory.expires_at)}"
    )
