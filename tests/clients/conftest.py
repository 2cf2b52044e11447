"""Client test fixtures: one live server shared by the SDK, CLI and browser tests (started once: each server start
loads a model and a worker), on the session fixtures' tiny model and real Redis."""

from __future__ import annotations

from pathlib import Path

import pytest
from txl_server.settings import Settings

from tests.helpers.live_server import LiveServer, live_settings

API_KEY = "client-test-key"


def server_settings(model_dir: Path, redis_url: str, **overrides) -> Settings:
    values = dict(
        model=model_dir,
        redis_url=redis_url,
        max_batch_size=16,
        threads=1,
        # No waiting for a session's writer: the SDK's handling of 409 conflicts needs conflicts to happen.
        lease_wait_seconds=0,
    )
    return live_settings("clients", **{**values, **overrides})


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
