"""What a place to keep objects offers the block store: a directory (directory.py) or an object store (objects.py),
each behind the local tier (local_tier.py) or not. Keys are relative paths (`blocks/ab/abcdef...`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


class StoreUnreachable(OSError):
    """The backend failed for a reason other than a missing object (I/O, permissions, the network)."""


@dataclass(frozen=True)
class Listed:
    key: str
    modified: float  # seconds since the epoch, by the backend's clock
    size: int


class Backend(Protocol):
    where: str  # what it is, for logs and errors ("the directory /data/blocks", "s3://bucket/prefix")

    async def put(self, key: str, data: bytes) -> None:
        """Stores `data` at `key` whole: a reader sees the old object, the new one, or none, never a part."""

    async def put_new(self, key: str, data: bytes) -> bool:
        """Stores `data` at `key` unless an object is there already; whether it did."""

    async def get(self, key: str) -> bytes | None:
        """The object at `key`, or None if there is none."""

    async def delete(self, keys: list[str]) -> None:
        """Deletes the objects at `keys` (a missing one is no error)."""

    def listing(self, prefix: str) -> AsyncIterator[Listed]:
        """Every object whose key starts with `prefix`."""
