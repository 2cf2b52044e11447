"""Sessions at rest cost disk, not Redis's RAM: a live server with persistence `always` keeps every block's bytes
in its block store and only metadata in Redis; a block the store lacks or holds damaged is a clear 410 for that
session alone; a commit that fails after its blocks were written leaves the session at its previous version; a
session an older server stored with its blocks in Redis still continues, and its blocks move to the store; the
object-store backend serves through obstore's local backend."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from txl_server.sessions.blocks.store import block_key

from tests.helpers.live_server import LiveServer, serve

from ...reliability.servers import stream_tokens


@pytest.fixture(scope="module")
def blocks_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("blocks")


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server, blocks_dir) -> Iterator[LiveServer]:
    yield from serve(tiny_model_dir, redis_server.url, "at-rest", block_store=str(blocks_dir))


def _service(server: LiveServer) -> Any:
    return server.app.state.runtime.service


def _written(server: LiveServer) -> None:
    """Waits for the blocks written behind their versions' commits (sessions/write_behind.py)."""
    server.run(_service(server).persistence.settled(30))


def _block_ids(server: LiveServer, sid: str) -> list[str]:
    """The blocks of the session's newest version, once written."""
    _written(server)
    stored = server.run(_service(server).store.load_version(sid))
    return list(stored.header["blocks"])


def _block_path(server: LiveServer, blocks_dir, block: str):
    store_id = server.app.state.runtime.blocks.store_id
    return blocks_dir / store_id / block_key(block)


def _forget(server: LiveServer, sid: str) -> None:
    """Drops this process's copy of the session: its next step reads it from the stores."""

    async def forget() -> None:
        _service(server).placement.forget(sid)

    server.run(forget())


def test_redis_keeps_metadata_only_and_the_blocks_are_in_the_store(server, blocks_dir):
    store = _service(server).store
    with server.client() as client:
        sids = [
            client.post("/v1/sessions", json={"text": f"At rest {i}. " * 20}).json()["id"] for i in range(4)
        ]
        for sid in sids:
            assert client.post(f"/v1/sessions/{sid}/append", json={"text": " and on"}).status_code == 200
    redis = store.redis

    async def block_fields() -> list[Any]:
        return [await redis.hkeys(key) async for key in redis.scan_iter(match=store.keys.every("k"))]

    fields = server.run(block_fields())
    assert fields and all(set(f) == {b"n"} for f in fields)  # references only: no bytes
    for sid in sids:
        for block in _block_ids(server, sid):
            assert _block_path(server, blocks_dir, block).is_file()


def test_a_session_whose_block_is_missing_or_damaged_answers_410_alone(server, blocks_dir):
    with server.client() as client:
        lost, damaged, fine = (
            client.post("/v1/sessions", json={"text": f"Session {name}. " * 10}).json()["id"]
            for name in ("lost", "damaged", "fine")
        )
        _block_path(server, blocks_dir, _block_ids(server, lost)[0]).unlink()
        path = _block_path(server, blocks_dir, _block_ids(server, damaged)[-1])
        path.write_bytes(path.read_bytes()[:-4])  # a write cut short
        for sid in (lost, damaged, fine):
            _forget(server, sid)
        for sid in (lost, damaged):
            response = client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 3})
            assert response.status_code == 410, response.text
            assert response.json()["error"]["code"] == "store_blocks_missing"
        assert client.post(f"/v1/sessions/{fine}/generate", json={"max_tokens": 3}).status_code == 200


class FailingCommit:
    """The commit script, made to fail as if Redis had gone away just before it (its blocks are written)."""

    def __init__(self, script: Any) -> None:
        self.script = script

    async def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")


def test_a_commit_that_fails_after_its_blocks_were_written_leaves_the_session_as_it_was(
    server, blocks_dir, monkeypatch
):
    store = _service(server).store
    # Its blocks written before its commit (none ahead of them: test_write_behind.py has those).
    monkeypatch.setattr(_service(server).persistence.settings, "write_behind_tokens", 0)
    with server.client() as client:
        created = client.post("/v1/sessions", json={"text": "Before the crash. " * 4}).json()
        sid = created["id"]
        before = sorted(p.name for p in blocks_dir.rglob("*") if p.is_file())
        store._commit = FailingCommit(store._commit)
        try:
            response = client.post(f"/v1/sessions/{sid}/append", json={"text": " lost " * 20})
        finally:
            store._commit = store._commit.script
        assert response.status_code == 503 and "nothing was changed" in response.json()["error"]["message"]
        after = sorted(p.name for p in blocks_dir.rglob("*") if p.is_file())
        assert len(after) > len(before)  # its blocks were written, and no version names them
        meta = client.get(f"/v1/sessions/{sid}").json()
        assert (meta["version"], meta["tokens"]) == (created["version"], created["tokens"])
        _forget(server, sid)
        got, _ = stream_tokens(client, sid, max_tokens=8)
        replay = client.post("/v1/sessions", json={"text": "Before the crash. " * 4}).json()["id"]
        assert got == stream_tokens(client, replay, max_tokens=8)[0]


def test_a_session_an_older_server_stored_in_redis_continues_and_its_blocks_move_to_the_store(
    server, blocks_dir
):
    """Format 3: each block's bytes in Redis (`k:{block}` field `d`), the header saying so."""
    service = _service(server)
    store, redis = service.store, service.store.redis
    with server.client() as client:
        text = "Stored by an older server. " * 6
        sid = client.post("/v1/sessions", json={"text": text}).json()["id"]
        expected, _ = stream_tokens(client, client.post("/v1/sessions", json={"text": text}).json()["id"])
        _written(server)

        async def make_it_old() -> list[str]:
            mkey = store.keys.versions(sid)
            version = (await redis.hget(mkey, "v")).decode()
            header = json.loads(await redis.hget(mkey, f"h:{version}"))
            for block in header["blocks"]:
                path = _block_path(server, blocks_dir, block)
                await redis.hset(store.keys.blocks + block, "d", path.read_bytes()[16:])
                path.unlink()
            header["format"] = 3
            await redis.hset(mkey, f"h:{version}", json.dumps(header))
            return list(header["blocks"])

        old_blocks = server.run(make_it_old())
        _forget(server, sid)
        got, _ = stream_tokens(client, sid)
        assert got == expected
        _written(server)  # its step's blocks, written behind its commit
        assert server.run(service.store.load_version(sid)).header["format"] == 4  # written to the store
        moved = server.run(_migrate(server))  # what is still in Redis (older versions) moves too
        assert moved == len(old_blocks)
        for block in old_blocks:
            assert not server.run(redis.hexists(store.keys.blocks + block, "d"))


async def _migrate(server: LiveServer) -> int:
    from txl_server.sessions.blocks.migration import migrate

    runtime = server.app.state.runtime
    return await migrate(runtime.service.store, runtime.blocks)


def test_an_object_store_serves_the_blocks(tiny_model_dir, redis_server, tmp_path):
    url = f"file://{tmp_path / 'objects'}"
    for live in serve(tiny_model_dir, redis_server.url, "objects", block_store=url, block_cache_bytes=0):
        with live.client() as client:
            text = "In an object store. " * 8
            sid = client.post("/v1/sessions", json={"text": text}).json()["id"]
            _written(live)  # then read back from the object store
            _forget(live, sid)
            got, _ = stream_tokens(client, sid)
            assert (
                got == stream_tokens(client, client.post("/v1/sessions", json={"text": text}).json()["id"])[0]
            )
        assert list((tmp_path / "objects").rglob("blocks/*/*"))


def test_a_deleted_sessions_blocks_leave_the_store_within_a_minute(server, blocks_dir):
    """The sweeper, as it runs in the server: every replica sweeps every 15 s, a block is collected once it is
    40 s old and no version lists it."""
    with server.client() as client:
        sid = client.post("/v1/sessions", json={"text": "Deleted soon. " * 10}).json()["id"]
        paths = [_block_path(server, blocks_dir, block) for block in _block_ids(server, sid)]
        assert all(path.is_file() for path in paths)
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
        deleted = time.monotonic()
        while any(path.exists() for path in paths):
            assert time.monotonic() - deleted < 60, "a deleted session's blocks are still in the store"
            time.sleep(1)
