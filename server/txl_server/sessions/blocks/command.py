"""`python -m txl_server store migrate|sweep|status`: the block store of the configured deployment, by hand.

    migrate   moves the blocks an older server kept in Redis into the block store (every server also does it in
              the background at start-up; this runs it to its end and says how many moved)
    sweep     collects, now, the blocks no version references any more (every server sweeps every 15 s)
    status    where the block store is, its store id, how many blocks it holds, and how many Redis still holds

Uses the same settings as the server (TXL_REDIS_URL, TXL_BLOCK_STORE, ...; the private Redis of the data
directory when no URL is set, which must not be in use by a running server).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from ...settings import Settings
from ..redis_server import EmbeddedRedis
from ..store.connection import connect_redis
from ..store.stores import Stores
from .identity import reconcile
from .migration import migrate
from .opening import open_blocks
from .sweeper import BlockSweeper


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m txl_server store", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["migrate", "sweep", "status"])
    args = parser.parse_args(list(argv))
    settings = Settings()
    try:
        return asyncio.run(_run(settings, args.action))
    except Exception as exc:  # one line: a tool, not a traceback
        print(f"txl_server store {args.action}: {exc}", file=sys.stderr)
        return 2


async def _run(settings: Settings, action: str) -> int:
    embedded = None
    url = settings.redis_url
    if url is None:
        embedded = EmbeddedRedis(settings.private_redis_dir())
        url = await asyncio.to_thread(embedded.start)
    redis = connect_redis(settings, url)
    try:
        stores = Stores.connect(redis, prefix=settings.redis_prefix)
        await stores.health.start()
        blocks = open_blocks(settings, embedded)
        await reconcile(blocks, stores.health)
        if action == "migrate":
            moved = await migrate(stores.sessions, blocks)
            print(f"moved {moved} blocks from Redis into {blocks.where}")
        elif action == "sweep":
            swept = await BlockSweeper(
                blocks, stores.sessions, hold_seconds=settings.block_store_hold_seconds
            ).sweep()
            held = " (held off: the session store lost data recently)" if swept.held else ""
            print(f"examined {swept.examined} blocks old enough, collected {swept.collected}{held}")
        else:
            count = 0
            async for _ in blocks.blocks():
                count += 1
            legacy = sum([len(found) async for found in stores.sessions.legacy_blocks()])
            print(f"block store: {blocks.where}\nstore id: {blocks.store_id}\nblocks: {count}")
            print(f"blocks whose bytes Redis still holds (an older server's): {legacy}")
        return 0
    finally:
        await redis.aclose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
