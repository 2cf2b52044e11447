"""The block store the settings name: a directory or an object store URL, with a local tier where one helps."""

from __future__ import annotations

from pathlib import Path

from ...settings import Settings
from .backend import Backend
from .directory import DirectoryBackend
from .local_tier import LocalTier
from .objects import ObjectBackend, is_object_store_url
from .store import BlockStore

# The local tier's default budget in front of an object store (a directory store needs none).
DEFAULT_CACHE_BYTES = 4 * 1024**3


def open_block_store(settings: Settings, location: str, *, cache_dir: Path | None = None) -> BlockStore:
    """The block store at `location` (a directory or an object store URL). `cache_dir`: where the local tier
    goes when the settings do not say (beside the server's data)."""
    backend: Backend
    shared = is_object_store_url(location)
    if shared:
        if location.startswith("file://"):
            Path(location.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        backend = ObjectBackend(location)
    else:
        root = Path(location).expanduser()
        root.mkdir(parents=True, exist_ok=True)
        backend = DirectoryBackend(root, fsync=settings.block_store_fsync)
    budget = settings.block_cache_bytes
    if budget is None:
        budget = DEFAULT_CACHE_BYTES if shared else 0
    directory = settings.block_cache_dir or cache_dir
    if budget > 0 and directory is not None:
        backend = LocalTier(backend, Path(directory).expanduser(), budget=budget)
    return BlockStore(backend)
