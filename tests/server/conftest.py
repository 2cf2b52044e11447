"""Server test fixtures: settings for a runtime on the shared Redis, and a runtime started for one test (the tiny
model and the Redis are the session fixtures of tests/helpers/fixtures.py)."""

from __future__ import annotations

import pytest
from txl_server.settings import Settings

from tests.helpers.live_server import live_settings
from tests.helpers.runtimes import running


@pytest.fixture
def make_settings(tiny_model_dir, redis_server):
    """Settings for a runtime on the shared Redis, isolated by a fresh key prefix."""

    def make(**overrides) -> Settings:
        values = {"model": tiny_model_dir, "redis_url": redis_server.url, "max_batch_size": 16}
        return live_settings("test", **{**values, **overrides})

    return make


@pytest.fixture
async def runtime(make_settings):
    async with running(make_settings()) as rt:
        yield rt
