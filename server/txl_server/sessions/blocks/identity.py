"""The block store and Redis belong together: the block store keeps each session store's blocks under that store's
id (the one Redis keeps in `{prefix}store`), with a mark written when the store first keeps blocks there. A
replica given the wrong block store (an empty local directory where the others share one) refuses to start
instead of answering every session `410`; deployments sharing a block store never touch each other's blocks; and a
Redis that came back empty under a new id leaves its old sessions' blocks where they were, named at start-up."""

from __future__ import annotations

import logging

from ..store.redis_health import RedisHealth
from .store import BlockStore, Marker

log = logging.getLogger(__name__)


class ForeignBlockStore(RuntimeError):
    """The block store holds nothing of the session store whose sessions keep their memories in a block store."""


async def reconcile(blocks: BlockStore, health: RedisHealth) -> Marker:
    """Binds the block store to Redis's store id (after `health.start()`) and checks it belongs: raises
    ForeignBlockStore (one line) if it holds nothing of a session store whose sessions keep their memories in a
    block store. Marks a new namespace."""
    assert health.identity is not None
    blocks.bind(health.identity)
    marker = await blocks.marker()
    if marker is None:
        if await health.uses_block_store():
            raise ForeignBlockStore(
                f"the block store {blocks.where} holds nothing of this session store (id {health.identity}), whose "
                "sessions keep their memories in a block store: give every replica sharing this Redis the same "
                "TXL_BLOCK_STORE (a shared directory or an object store URL)"
            )
        await blocks.write_marker(Marker(health.identity), new=True)  # another replica's first is as good
        marker = await blocks.marker() or Marker(health.identity)
    await health.note_block_store()
    others = await blocks.other_stores()
    if others:
        log.info(
            "the block store %s also holds the blocks of %d other session stores (%s): left alone (another "
            "deployment's, or a Redis's that came back empty under a new id: delete its directory once it is "
            "not to be restored)",
            blocks.where,
            len(others),
            ", ".join(others[:5]),
        )
    return marker
