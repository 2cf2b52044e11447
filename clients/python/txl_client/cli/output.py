"""What the commands print: a list as a table or as JSON, what a command made, and a session in one line."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

from ..types import Memory, Session

L = TypeVar("L", Session, Memory)


def print_list(
    items: Sequence[L],
    row: str,
    *,
    as_json: bool,
    none: str,
    order: Callable[[L], float] | None = None,
) -> int:
    """`items` as a JSON list; or as a table: a header, then a line per item in `order`, both by the format
    string `row` (its fields: `table_fields`), or `none` on stderr when there are none."""
    if as_json:
        print(json.dumps([item.model_dump() for item in items], indent=2))
        return 0
    if not items:
        print(none, file=sys.stderr)
        return 0
    width = max(len(item.id) for item in items)
    titles = {name: name for name in ("id", "tokens", "memory", "version", "expires", "name")}
    print(row.format(width=width, **titles))
    for item in sorted(items, key=order) if order else items:
        print(row.format(width=width, **table_fields(item)))
    return 0


def table_fields(item: Session | Memory) -> dict[str, object]:
    """What a table shows of a session or a memory: its fields, and `memory` (positions held / mem_len),
    `expires` (a date) and `name` (or nothing)."""
    return {
        **item.model_dump(),
        "memory": f"{item.mem_tokens}/{item.mem_len}",
        "expires": when(item.expires_at),
        "name": getattr(item, "name", None) or "",
    }


def print_made(item: Session | Memory, description: str, *, as_json: bool) -> int:
    """What a command made: as JSON, or its id on stdout (for scripts) and `description` on stderr."""
    if as_json:
        print(item.model_dump_json(indent=2))
        return 0
    print(item.id)
    print(description, file=sys.stderr)
    return 0


def describe(session: Session) -> str:
    return (
        f"session {session.id}: {session.tokens} tokens, memory {session.mem_tokens}/{session.mem_len}, "
        f"version {session.version}, model {session.model}, expires {when(session.expires_at)}"
        + (f", metadata {json.dumps(session.metadata)}" if session.metadata else "")
    )


def when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
