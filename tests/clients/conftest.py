"""Client test fixtures: the server tests' tiny model and real Redis, and one live server shared by the SDK, CLI
and browser tests (started once: each server start loads a model and a worker)."""

from __future__ import annotations

import uuid

import pytest
from txl_server.settings import Settings

from tests.server import conftest as server_fixtures
from tests.server.live_server import LiveServer

# The server tests' session fixtures, shared here: a tiny byte-level model saved for real, and a real Redis.
tiny_model_dir = server_fixtures.tiny_model_dir
redis_server = server_fixtures.redis_server

API_KEY = "client-test-key"


def server_settings(model_dir, redis_url: str, **overrides) -> Settings:
    values = dict(
        model=model_dir,
        redis_url=redis_url,
        redis_prefix=f"clients-{uuid.uuid4().hex[:6]}:",
        max_batch_size=16,
        threads=1,
        # No waiting for a session's writer: the SDK's handling of 409 conflicts needs conflicts to happen.
        lease_wait_seconds=0,
    )
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="session")
def server(tiny_model_dir, redis_server):
    settings = server_settings(
        tiny_model_dir,
        redis_server.url,
        api_keys=API_KEY,
        max_body_bytes=64 * 1024,
        max_text_chars=8 * 1024,
        max_tokens=512,
        max_stop_strings=2,
    )
    with LiveServer(settings) as live:
        yield live
