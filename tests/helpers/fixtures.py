"""The session fixtures every suite that runs a server uses: a tiny byte-level model saved for real, and a real
Redis. Registered for the whole tree by tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from txl_server.sessions.redis_server import EmbeddedRedis

from tests.helpers.tiny_models import make_byte_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_byte_model_dir(tmp_path_factory.mktemp("models") / "tiny-byte")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()
