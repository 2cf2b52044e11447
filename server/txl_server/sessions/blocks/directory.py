"""A directory as a block store: a local disk, or a filesystem that every replica mounts (NFS, EFS, Filestore,
CephFS). Each object is one file, written to a temporary name and renamed into place, so that a reader never sees
half of one; with `fsync`, the file and its directory are synced before the write returns (a power loss then
loses nothing acknowledged; without it, the kernel's writeback decides: a crash of the server loses nothing, a
crash of the machine may lose the last seconds). The work runs in threads, off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from .backend import Listed, StoreUnreachable


class DirectoryBackend:
    def __init__(self, root: Path, *, fsync: bool = False) -> None:
        self.root = root
        self.fsync = fsync
        self.where = f"the directory {root}"

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, key, data, replace=True)

    async def put_new(self, key: str, data: bytes) -> bool:
        return await asyncio.to_thread(self._put, key, data, replace=False)

    async def get(self, key: str) -> bytes | None:
        return await asyncio.to_thread(self._get, key)

    async def delete(self, keys: list[str]) -> None:
        await asyncio.to_thread(self._delete, keys)

    async def listing(self, prefix: str) -> AsyncIterator[Listed]:
        for item in await asyncio.to_thread(self._list, prefix):
            yield item

    # ------------------------------------------------------------------ in a thread

    def _put(self, key: str, data: bytes, *, replace: bool) -> bool:
        path = self.root / key
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(temporary, "wb") as file:
                file.write(data)
                if self.fsync:
                    file.flush()
                    os.fsync(file.fileno())
            if replace:
                os.replace(temporary, path)
            else:
                try:
                    os.link(temporary, path)  # fails if the name is taken: only the first writer wins
                except FileExistsError:
                    return False
                finally:
                    os.unlink(temporary)
            if self.fsync:
                self._sync_directory(path.parent)
            return True
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise StoreUnreachable(f"cannot write to {self.where}: {exc.strerror or exc}") from exc

    def _get(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnreachable(f"cannot read from {self.where}: {exc.strerror or exc}") from exc

    def _delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                os.unlink(self.root / key)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreUnreachable(
                    f"cannot remove a file in {self.where}: {exc.strerror or exc}"
                ) from exc

    def _list(self, prefix: str) -> list[Listed]:
        base = self.root / prefix
        found: list[Listed] = []
        if not base.is_dir():
            return found
        stack = [base]
        while stack:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif not entry.name.startswith("."):  # a write in progress
                        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                            stat = entry.stat(follow_symlinks=False)
                            key = os.path.relpath(entry.path, self.root)
                            found.append(Listed(key, stat.st_mtime, stat.st_size))
        return found

    @staticmethod
    def _sync_directory(path: Path) -> None:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
