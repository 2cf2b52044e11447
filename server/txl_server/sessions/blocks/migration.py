"""Moving the blocks an older server kept in Redis (format 3: each block's bytes in `k:{block}`'s field `d`) into
the block store, so that Redis holds metadata only.

Safe while servers run: a block's bytes are written to the store first, then dropped from Redis by a script that
does so only while the block is still referenced; a reader finds them in Redis before the drop and in the store
after it. Every server runs it once at start-up, in the background (sessions are also moved as they are used:
a session read from Redis in format 3 is written whole to the store at its next commit);
`python -m txl_server store migrate` runs it to the end and says what it did.
"""

from __future__ import annotations

import logging

from ..store.sessions import SessionStore
from .store import BlockStore

log = logging.getLogger(__name__)


async def migrate(store: SessionStore, blocks: BlockStore, *, batch: int = 200) -> int:
    """Moves every block Redis still holds the bytes of into the block store; how many it moved."""
    moved = 0
    async for found in store.legacy_blocks(batch):
        await blocks.write(found)
        moved += await store.drop_legacy_data(list(found))
    if moved:
        log.info("moved %d blocks an older server kept in Redis into the block store %s", moved, blocks.where)
    return moved
