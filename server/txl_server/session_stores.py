"""Where sessions are kept, said in one line at start-up and at shutdown, and whether the configured stores can
keep them at all, checked before the model loads (so that start-up stops in one line)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

from .errors import Unavailable
from .sessions.blocks.identity import check as check_block_store
from .sessions.blocks.opening import open_blocks
from .sessions.blocks.store import BlockStore
from .sessions.placement import Released
from .sessions.redis_server import EmbeddedRedis
from .sessions.store.connection import connect_redis
from .sessions.store.redis_health import EvictingRedis, RedisHealth, eviction_refusal
from .settings import Persistence, Settings


def where_sessions_are(settings: Settings, embedded: EmbeddedRedis | None, blocks: BlockStore | None) -> str:
    """One line for the start-up log: where sessions are kept, and what survives a restart."""
    survive = {
        Persistence.ALWAYS: "every step is saved: sessions survive restarts and crashes",
        Persistence.EVICT: "sessions are saved when evicted and at shutdown: they survive a graceful "
        "restart, a crash loses those held in memory",
        Persistence.NONE: "memory stays in this process: sessions do not survive a restart",
    }[settings.persistence]
    mode = f"persistence {settings.persistence.value}"
    memories = f", their memories in {blocks.where}" if blocks is not None else ""
    if embedded is None:
        return f"sessions are kept in the Redis at {redacted(settings.redis_url or '')}{memories} ({mode}): {survive}"
    if embedded.ephemeral:
        return (
            "sessions are throw-away (--ephemeral): kept in a temporary directory deleted at shutdown, "
            f"{embedded.data_dir}"
        )
    return (
        f"sessions are kept in {embedded.data_dir}{memories} ({mode}): {survive}; "
        "--ephemeral (TXL_EPHEMERAL=1) for throw-away ones"
    )


def where_sessions_were(settings: Settings, embedded: EmbeddedRedis | None, released: Released | None) -> str:
    """One line for the shutdown log."""
    what = ""
    if released is not None and (released.saved or released.lost):
        what = f" ({released.saved} saved from memory now, {released.lost} lost)"
    if embedded is None:
        return f"stopped; sessions are kept in the Redis at {redacted(settings.redis_url or '')}{what}"
    if embedded.ephemeral:
        return "stopped; the throw-away sessions were deleted with their temporary directory"
    return f"stopped; sessions are kept in {embedded.data_dir} for the next start{what}"


def check_redis(settings: Settings) -> None:
    """Before the model loads: raises EvictingRedis if the configured Redis evicts keys (and the settings do not
    accept it), ForeignBlockStore if its sessions keep their memories in a block store of which the configured one
    holds nothing, so that start-up stops in one line. A Redis that does not answer yet is checked once it
    does."""

    async def check() -> None:
        assert settings.redis_url is not None
        redis = connect_redis(settings, settings.redis_url)
        try:
            health = RedisHealth(
                redis, prefix=settings.redis_prefix, allow_eviction=settings.redis_allow_eviction
            )
            info = await health.info()
            if info.evicting and not settings.redis_allow_eviction:
                raise EvictingRedis(eviction_refusal(info.maxmemory_policy))
            await check_block_store(open_blocks(settings, None), health)
        except Unavailable:
            pass
        finally:
            await redis.aclose()

    if settings.redis_url is not None:
        asyncio.run(check())


def redacted(url: str) -> str:
    """A Redis URL fit for a log: its password replaced."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
