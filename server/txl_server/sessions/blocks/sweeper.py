"""The sweeper: blocks no version names any more leave the store within a minute, and no other ever does.

A block's references are counted in Redis (`k:{block}`, lua/versions.lua): the key goes when the last version
listing it is dropped (its session deleted, the version pushed out of TXL_KEEP_VERSIONS), and expires when every
version listing it has expired (a session whose TTL ran out: no script runs then). A block whose bytes are in the
store but whose key is not in Redis is therefore garbage, if it is old enough: a commit writes its new blocks
first and their keys in the same script as its version, and Redis refuses a version whose new blocks were written
more than MAX_BLOCK_AGE_SECONDS earlier (store/versions.py), so a block older than BLOCK_GRACE_SECONDS without a
key can no longer be named by any version (a crashed writer's, say). Once a block's key is gone its id is dead:
a version that lists an id the store lacks is refused, and written again under new ids.

Every replica runs a sweeper; a lock in Redis lets one sweep at a time. After Redis was found to have lost data
(store.json's `loss_at`), the sweeper holds off for TXL_BLOCK_STORE_HOLD_SECONDS: its keys being gone means
nothing then, and a Redis restored from a backup finds its sessions' blocks.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass

from ..store.plumbing import now
from ..store.sessions import SessionStore
from ..store.versions import MAX_BLOCK_AGE_SECONDS
from .store import BlockStore

log = logging.getLogger(__name__)

# A block without a reference this long after it was written is collected: past MAX_BLOCK_AGE_SECONDS no version
# can name it any more, and the rest covers the clocks of the block store and of Redis disagreeing.
BLOCK_GRACE_SECONDS = 2 * MAX_BLOCK_AGE_SECONDS
SWEEP_SECONDS = 15.0  # grace + one sweep: a block is collected within a minute of losing its last reference
BATCH = 1000


@dataclass(frozen=True)
class Swept:
    examined: int  # blocks older than the grace period
    collected: int
    held: bool = False  # held off after a loss of data


class BlockSweeper:
    def __init__(
        self, blocks: BlockStore, store: SessionStore, *, hold_seconds: float, interval: float = SWEEP_SECONDS
    ) -> None:
        self.blocks = blocks
        self.store = store
        self.hold_seconds = hold_seconds
        self.interval = interval
        self._token = secrets.token_hex(8)
        self._holding_said = False

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                swept = await self.sweep()
            except Exception as exc:  # Redis or the store away: next round
                log.debug("block sweep skipped: %s", exc)
                continue
            if swept.collected:
                log.info("collected %d blocks no session lists any more", swept.collected)

    async def sweep(self) -> Swept:
        """One sweep, if this replica takes the lock (else nothing)."""
        marker = await self.blocks.marker()
        if marker is not None and marker.loss_at is not None and now() - marker.loss_at < self.hold_seconds:
            if not self._holding_said:
                self._holding_said = True
                log.warning(
                    "the block store keeps every block until %.0f s after the session store lost data "
                    "(TXL_BLOCK_STORE_HOLD_SECONDS), so that a Redis restored from a backup finds its sessions' "
                    "blocks",
                    self.hold_seconds,
                )
            return Swept(0, 0, held=True)
        if not await self.store.take_sweep_lock(self._token, int(2 * self.interval * 1000)):
            return Swept(0, 0)
        cutoff = now() - BLOCK_GRACE_SECONDS
        old = [block async for block, written in self.blocks.blocks() if written < cutoff]
        collected = 0
        for start in range(0, len(old), BATCH):
            batch = old[start : start + BATCH]
            named = await self.store.referenced(batch)
            dead = [block for block in batch if block not in named]
            if dead:
                await self.blocks.delete(dead)
                collected += len(dead)
        return Swept(len(old), collected)
