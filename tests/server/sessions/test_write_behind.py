"""Write-behind: a step is acknowledged once Redis holds its version as the version before it and the token ids it
fed; its blocks follow. A live server with persistence `always` on a real Redis and a directory block store: a
version read back before its blocks were written (as a restart or another replica would read it) continues exactly
as the session would have; once written, the version names its own blocks and counts them, and a deleted session
leaves no reference behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.live_server import LiveServer, serve
from tests.helpers.server_process import standalone

from .test_sessions_at_rest import _block_path, _forget, _service

GREEDY = {"max_tokens": 16, "temperature": 0}
PROBE = " What the log said next."


@pytest.fixture(scope="module")
def blocks_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("behind-blocks")


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server, blocks_dir) -> Iterator[LiveServer]:
    yield from serve(tiny_model_dir, redis_server.url, "behind", block_store=str(blocks_dir))


class HeldBack:
    """Holds the blocks the server writes behind its commits until `release`: the state of a server that crashed
    after answering, before its blocks reached the store."""

    def __init__(self, server: LiveServer) -> None:
        self.persistence = _service(server).persistence
        self.held: list[tuple[Any, ...]] = []
        self.original = self.persistence.settle_later
        self.persistence.settle_later = lambda *args: self.held.append(args)

    def release(self, server: LiveServer) -> None:
        """Writes the blocks held back (on the server's loop), and waits for them."""
        self.persistence.settle_later = self.original

        async def write() -> None:
            for args in self.held:
                self.original(*args)
            await self.persistence.settled(30)

        server.run(write())

    def drop(self) -> None:
        self.persistence.settle_later = self.original
        for args in self.held:
            args[2].release()  # the states they held


def _stored(server: LiveServer, sid: str) -> dict[str, Any]:
    store = _service(server).store
    raw = server.run(store.redis.hgetall(store.keys.versions(sid)))
    return {k.decode(): v for k, v in raw.items()}


def _refs(server: LiveServer) -> dict[str, int]:
    store = _service(server).store
    redis = store.redis

    async def refs() -> dict[str, int]:
        out = {}
        async for key in redis.scan_iter(match=store.keys.every("k")):
            out[key.decode().rpartition(":")[2]] = int(await redis.hget(key, "n"))
        return out

    return server.run(refs())


def _listings(server: LiveServer, sids: list[str]) -> dict[str, int]:
    """Per block, how many kept versions of `sids` list it (what Redis's counts must say)."""
    counts: dict[str, int] = {}
    for sid in sids:
        for field, value in _stored(server, sid).items():
            if field.startswith("h:"):
                for block in json.loads(value)["blocks"]:
                    counts[block] = counts.get(block, 0) + 1
    return counts


def _continue(client, sid: str) -> tuple[float, str]:
    """How likely the session finds a probe text, then what it writes after it (greedy)."""
    appended = client.post(f"/v1/sessions/{sid}/append", json={"text": PROBE})
    assert appended.status_code == 200, appended.text
    response = client.post(f"/v1/sessions/{sid}/generate", json=GREEDY)
    assert response.status_code == 200, response.text
    return appended.json()["logprob"], response.json()["text"]


def test_a_version_read_before_its_blocks_continues_as_the_session_would(server):
    with server.client() as client:
        text = "The lighthouse keeper counted the ships. " * 6
        sid = client.post("/v1/sessions", json={"text": text}).json()["id"]
        twin = client.post(f"/v1/sessions/{sid}/fork").json()["id"]  # stays on the device throughout
        server.run(_service(server).persistence.settled(30))  # the create's blocks written
        held = HeldBack(server)
        try:
            steps = [" Then the fog came in.", " Nobody slept."]
            for step in steps:
                for s in (sid, twin):
                    assert client.post(f"/v1/sessions/{s}/append", json={"text": step}).status_code == 200
            generated = client.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 5, "temperature": 0})
            assert (
                client.post(f"/v1/sessions/{twin}/generate", json={"max_tokens": 5, "temperature": 0}).json()[
                    "text"
                ]
                == generated.json()["text"]
            )
            stored = _stored(server, sid)
            version = int(stored["v"])
            replay = json.loads(stored[f"r:{version}"])  # the steps' tokens, after the create's stored state
            assert len(replay) == sum(len(s) for s in steps) + 5  # the byte model: a token per byte
            assert stored[f"h:{version}"] == stored["h:1"]  # it names the create's blocks
            assert len(held.held) == 2 * 3
        finally:
            held.drop()
        _forget(server, sid)  # read back from the stores: the create's blocks, then its tokens fed again
        logprob_after, text_after = _continue(client, sid)
        logprob_twin, text_twin = _continue(client, twin)
        assert text_after == text_twin
        assert logprob_after == pytest.approx(logprob_twin, abs=1e-3)


def test_the_blocks_written_behind_settle_the_version_and_are_counted(server, blocks_dir):
    with server.client() as client:
        held = HeldBack(server)
        sid = client.post("/v1/sessions", json={"text": "Counting blocks. " * 8}).json()["id"]
        first = _stored(server, sid)  # a new session, ahead of its blocks: an empty memory and its tokens
        assert json.loads(first["h:1"])["blocks"] == [] and len(json.loads(first["r:1"])) == 8 * 17 + 1
        held.release(server)
        steps = (" One.", " Two, a little longer than the first.", " Three.")
        for step in steps:  # one after another, each version's blocks written before the next step
            held = HeldBack(server)
            assert client.post(f"/v1/sessions/{sid}/append", json={"text": step}).status_code == 200
            assert _refs(server).items() >= _listings(server, [sid]).items()
            held.release(server)
        stored = _stored(server, sid)
        assert sorted(f for f in stored if f.startswith("r:")) == []  # every version settled
        versions = sorted(int(f[2:]) for f in stored if f.startswith("h:"))
        assert versions == [1, 2, 3, 4]
        for v in versions:
            header = json.loads(stored[f"h:{v}"])
            assert header["fed"] == 8 * 17 + 1 + sum(len(s) for s in steps[: v - 1])  # its own state's
            assert all(_block_path(server, blocks_dir, b).is_file() for b in header["blocks"])
        counts = _refs(server)
        for block, n in _listings(server, [sid]).items():
            assert counts[block] == n
        for step in steps:  # a burst: only its newest version gets its blocks, the others stay readable
            assert client.post(f"/v1/sessions/{sid}/append", json={"text": step}).status_code == 200
        server.run(_service(server).persistence.settled(30))
        stored = _stored(server, sid)
        assert sorted(f for f in stored if f.startswith("r:")) == ["r:5", "r:6"]
        assert "r:7" not in stored and stored["h:5"] == stored["h:6"] == stored["h:4"]
        counts = _refs(server)
        for block, n in _listings(server, [sid]).items():
            assert counts[block] == n
        _forget(server, sid)
        assert client.post(f"/v1/sessions/{sid}/append", json={"text": " Four."}).status_code == 200
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
        server.run(_service(server).persistence.settled(30))
    assert not set(_listings(server, [sid])) & set(_refs(server))


def test_a_session_deleted_before_its_blocks_were_written_leaves_no_reference(server):
    with server.client() as client:
        sid = client.post("/v1/sessions", json={"text": "Short lived. " * 8}).json()["id"]
        listed_before = set(_listings(server, [sid]))
        held = HeldBack(server)
        assert client.post(f"/v1/sessions/{sid}/append", json={"text": " Gone soon."}).status_code == 200
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
        held.release(server)  # its blocks are written, but no version is left to settle
    assert not listed_before & set(_refs(server))
    assert _stored(server, sid) == {}


def test_a_step_answered_before_its_blocks_survives_kill_9(tiny_model_dir, tmp_path):
    """A server process whose block writes wait ten minutes: every step it answers is in Redis as tokens only;
    killed, the next process continues each session exactly, from no blocks at all."""
    data_home = tmp_path / "data"
    server = standalone(
        tiny_model_dir,
        tmp_path / "server.log",
        XDG_DATA_HOME=str(data_home),
        TXL_PERSISTENCE="always",
        TXL_WRITE_BEHIND_DELAY_MS="600000",
    )
    text, more = "The ferry left at dawn. " * 5, " The river was high that spring."
    try:
        server.start()
        with server.client() as client:
            sid = client.post("/v1/sessions", json={"text": text}).json()["id"]
            assert client.post(f"/v1/sessions/{sid}/append", json={"text": more}).status_code == 200
        assert not [p for p in data_home.rglob("blocks/??/*") if p.is_file()]  # nothing written yet
        server.kill()
        server.start()
        with server.client() as client:
            session = client.get(f"/v1/sessions/{sid}").json()
            assert (session["version"], session["tokens"]) == (2, len(text + more))
            got = client.post(f"/v1/sessions/{sid}/generate", json=GREEDY).json()["text"]
            fresh = client.post("/v1/sessions", json={"text": text + more}).json()["id"]
            assert got == client.post(f"/v1/sessions/{fresh}/generate", json=GREEDY).json()["text"]
        assert server.terminate() == 0  # a graceful stop writes what waits
        assert [p for p in data_home.rglob("blocks/??/*") if p.is_file()]
    finally:
        server.kill()
