"""A runtime (worker, Redis store, session service) started for the length of a block."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from txl_server.runtime import Runtime
from txl_server.settings import Settings


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Runtime]:
    runtime = Runtime(settings)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()
