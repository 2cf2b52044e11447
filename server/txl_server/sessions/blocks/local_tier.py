"""A replica's local disk in front of a shared block store: the blocks it used recently, under a byte budget.

Between the host's RAM and the shared store (an object store, or a network filesystem), each replica keeps a
directory of the blocks it wrote or read, least recently used out past `budget` bytes. A write goes to both
(the shared store first: a block is durable there before any version names it); a read is served from the local
copy when there is one, else fetched from the shared store and kept. A session another replica picks up is read
from the shared store; the copies here are only ever a cache (a block is never changed once written, so a copy
is never stale), and a damaged copy is dropped and read again from the shared store.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path

from .backend import Backend, Listed
from .directory import DirectoryBackend


class LocalTier:
    def __init__(self, shared: Backend, directory: Path, *, budget: int) -> None:
        self.shared = shared
        self.local = DirectoryBackend(directory)
        self.budget = budget
        self.where = f"{shared.where} (with a local tier in {directory}, {budget} bytes)"
        self._sizes: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._held = 0
        self._scan_task: asyncio.Task[None] | None = None

    async def put(self, key: str, data: bytes) -> None:
        await self.shared.put(key, data)
        await self._keep(key, data)

    async def put_new(self, key: str, data: bytes) -> bool:
        return await self.shared.put_new(key, data)

    async def get(self, key: str) -> bytes | None:
        await self._scan()
        if key in self._sizes:
            data = await self.local.get(key)
            if data is not None:
                self._sizes.move_to_end(key)
                return data
            self._forget(key)
        data = await self.shared.get(key)
        if data is not None:
            await self._keep(key, data)
        return data

    async def delete(self, keys: list[str]) -> None:
        await self.shared.delete(keys)
        await self.drop(keys)

    async def drop(self, keys: list[str]) -> None:
        """Drops the local copies of `keys` (one found damaged, say)."""
        await self.local.delete(keys)
        for key in keys:
            self._forget(key)

    def listing(self, prefix: str) -> AsyncIterator[Listed]:
        return self.shared.listing(prefix)

    @property
    def held_bytes(self) -> int:
        return self._held

    async def _keep(self, key: str, data: bytes) -> None:
        await self._scan()
        if len(data) > self.budget:
            return
        await self.local.put(key, data)
        self._forget(key)
        self._sizes[key] = len(data)
        self._held += len(data)
        victims = []
        while self._held > self.budget and self._sizes:
            victim, size = self._sizes.popitem(last=False)
            self._held -= size
            victims.append(victim)
        if victims:
            await self.local.delete(victims)

    def _forget(self, key: str) -> None:
        size = self._sizes.pop(key, None)
        if size is not None:
            self._held -= size

    async def _scan(self) -> None:
        """Takes over what an earlier process left in the directory (oldest first, by access time), once: every
        caller waits for the same scan, so that nothing written meanwhile is counted twice."""
        if self._scan_task is None:
            self._scan_task = asyncio.ensure_future(self._take_over())
        await asyncio.shield(self._scan_task)

    async def _take_over(self) -> None:
        for key, size in await asyncio.to_thread(self._found):
            self._sizes[key] = size
            self._held += size

    def _found(self) -> list[tuple[str, int]]:
        root = self.local.root
        entries = []
        for path in root.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                stat = path.stat()
                entries.append((max(stat.st_atime, stat.st_mtime), os.path.relpath(path, root), stat.st_size))
        return [(key, size) for _, key, size in sorted(entries)]
