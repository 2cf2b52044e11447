"""The block store as the session layer uses it: blocks written (in parallel, off the event loop) before any
version names them, read back checked, and the store's identity beside Redis's.

Objects (keys under the store's root or prefix), in a namespace per session store (the id Redis keeps in
`{prefix}store`: store/redis_health.py), so that deployments, or a Redis that came back empty under a new id, never
see or collect each other's blocks:
    {store}/blocks/{id[:2]}/{id}   one block: codec.py's header, then every layer's keys and values of its positions
    {store}/store.json             the namespace's mark: written when the session store first kept blocks here, and
                                   when that Redis was last found to have lost data (the sweeper holds off)

Redis holds which versions name which block (and how many: store/blocks.py); a block no version names any more
is collected by the sweeper (sweeper.py). A read that finds a block missing or damaged is that session's error
alone (`BlocksLost`), never a wrong token; a store that cannot be reached is `Unavailable`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import Unavailable
from ...telemetry.spans import traced
from ..store.blocks import Buffer
from .backend import Backend, Payload, StoreUnreachable
from .codec import DamagedBlock, decode, header
from .local_tier import LocalTier

log = logging.getLogger(__name__)

BLOCKS = "blocks/"
MARKER = "store.json"


class BlocksLost(Exception):
    """Blocks a version names that the store does not hold whole (deleted by hand, a partial write)."""

    def __init__(self, missing: set[str], damaged: set[str]) -> None:
        self.missing, self.damaged = missing, damaged
        super().__init__(f"{len(missing)} blocks missing, {len(damaged)} damaged")


def block_key(block_id: str) -> str:
    """A block's key in its namespace."""
    return f"{BLOCKS}{block_id[:2]}/{block_id}"


@dataclass(frozen=True)
class Marker:
    store_id: str
    loss_at: float | None = None  # when the session store was last found to have lost data

    def to_json(self) -> bytes:
        return json.dumps({"store_id": self.store_id, "loss_at": self.loss_at}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Marker:
        value: dict[str, Any] = json.loads(raw)
        loss = value.get("loss_at")
        return cls(str(value["store_id"]), float(loss) if loss is not None else None)


class BlockStore:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.store_id: str | None = None  # the namespace (`bind`), once Redis has said which store it is

    @property
    def where(self) -> str:
        return self.backend.where

    def bind(self, store_id: str) -> None:
        """Uses the namespace of the session store `store_id`."""
        self.store_id = store_id

    def _key(self, key: str) -> str:
        if self.store_id is None:
            raise Unavailable("the block store is not ready yet (the session store has not answered)")
        return f"{self.store_id}/{key}"

    async def write(self, blocks: Mapping[str, Buffer]) -> None:
        """Stores every block (id -> data); returns when all are written."""
        if blocks:
            await self.write_encoded(await asyncio.to_thread(self.encoded, blocks))

    def encoded(self, blocks: Mapping[str, Buffer]) -> list[tuple[str, Payload]]:
        """The blocks as the backend stores them: each its key, its header, and its data as it is (no copy).
        Computes their checksums: call it off the event loop (with the snapshot that made them)."""
        return [(self._key(block_key(i)), [header(d), d]) for i, d in blocks.items()]

    @traced("blocks.write")
    async def write_encoded(self, items: list[tuple[str, Payload]]) -> None:
        """Stores what `encoded` made; returns when all of it is written."""
        if not items:
            return
        try:
            await self.backend.put_many(items)
        except StoreUnreachable as exc:
            raise self._unavailable(exc) from exc

    async def read(self, ids: Sequence[str], *, again: bool = False) -> list[bytes]:
        """The blocks' data, in order. Raises BlocksLost naming those missing or damaged."""
        try:
            raw = await asyncio.gather(*(self.backend.get(self._key(block_key(i))) for i in ids))
        except StoreUnreachable as exc:
            raise self._unavailable(exc) from exc
        missing, damaged, out = set(), set(), []
        for block, data in zip(ids, raw, strict=True):
            if data is None:
                missing.add(block)
                continue
            try:
                out.append(decode(data))
            except DamagedBlock as exc:
                log.error("block %s in %s is damaged: %s", block, self.where, exc)
                damaged.add(block)
        if damaged and not again and isinstance(self.backend, LocalTier):  # a damaged local copy: once more
            await self.backend.drop([self._key(block_key(b)) for b in damaged])
            return await self.read(ids, again=True)
        if missing or damaged:
            raise BlocksLost(missing, damaged)
        return out

    async def delete(self, ids: Sequence[str]) -> None:
        try:
            await self.backend.delete([self._key(block_key(i)) for i in ids])
        except StoreUnreachable as exc:
            raise self._unavailable(exc) from exc

    async def blocks(self) -> AsyncIterator[tuple[str, float]]:
        """Every block in the store: (id, when it was written)."""
        try:
            async for listed in self.backend.listing(self._key(BLOCKS)):
                name = listed.key.rpartition("/")[2]
                if name:
                    yield name, listed.modified
        except StoreUnreachable as exc:
            raise self._unavailable(exc) from exc

    async def marker(self) -> Marker | None:
        raw = await self.backend.get(self._key(MARKER))
        return Marker.from_json(raw) if raw is not None else None

    async def write_marker(self, marker: Marker, *, new: bool = False) -> bool:
        """Writes the namespace's mark (with `new`, only if it has none yet: whether it did)."""
        if new:
            return await self.backend.put_new(self._key(MARKER), marker.to_json())
        await self.backend.put(self._key(MARKER), marker.to_json())
        return True

    async def other_stores(self) -> list[str]:
        """The ids of other session stores whose blocks are here too (their marks)."""
        found = []
        async for listed in self.backend.listing(""):
            namespace, _, rest = listed.key.partition("/")
            if rest == MARKER and namespace != self.store_id:
                found.append(namespace)
        return sorted(found)

    def _unavailable(self, exc: StoreUnreachable) -> Unavailable:
        log.warning("%s", exc)
        return Unavailable("the block store (session memories) is unavailable; nothing was changed")
