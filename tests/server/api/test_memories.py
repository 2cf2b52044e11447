"""Preloaded memories over HTTP, on a real Redis: read a document once, start sessions from it exactly, share its
blocks (one copy on the device and in Redis), outlive its deletion, survive restarts, serve any replica, and stay
with their owner."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from txl_server.api.shared.auth import ANONYMOUS
from txl_server.settings import Persistence, Settings

from tests.helpers.gate import Gate
from tests.helpers.live_server import LiveServer, client_fixture, live_server_fixture
from tests.helpers.server_process import ServerProcess, process_env

from .test_disconnect import KEY, abandon, metric, send_and_leave, wait_until

DOC = "The lighthouse keeper wrote in his log every evening, whatever the weather. " * 14  # ~130 segments
QUESTION = " What did he write on the last night?"
GREEDY = {"max_tokens": 24, "temperature": 0}


server = live_server_fixture("memories", persistence=Persistence.ALWAYS, api_keys=KEY)
http = client_fixture(KEY)


def _memory(http, text: str = DOC, **body) -> dict:
    response = http.post("/v1/memories", json={"text": text, **body})
    assert response.status_code == 201, response.text
    return response.json()


def _session(http, **body) -> dict:
    response = http.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def _continuation(http, session_id: str) -> tuple[str, float]:
    """Greedy text after the session (on a fork), and the log-prob of a fixed append after the session."""
    fork = http.post(f"/v1/sessions/{session_id}/fork")
    assert fork.status_code == 201, fork.text
    generated = http.post(f"/v1/sessions/{fork.json()['id']}/generate", json=GREEDY)
    assert generated.status_code == 200, generated.text
    appended = http.post(f"/v1/sessions/{session_id}/append", json={"text": " The end."})
    assert appended.status_code == 200, appended.text
    return generated.json()["text"], appended.json()["logprob"]


def _read_it_all(http, text: str = "") -> tuple[str, float]:
    """The continuation of a session that read the document itself, then `text`."""
    session = _session(http, text=DOC)["id"]
    if text:
        http.post(f"/v1/sessions/{session}/append", json={"text": text})
    return _continuation(http, session)


def test_a_memory_is_created_listed_changed_and_deleted(server, http):
    memory = _memory(http, name="keeper's log", metadata={"source": "test"}, ttl_seconds=600)
    assert memory["id"].startswith("mem_") and memory["object"] == "memory"
    assert (memory["name"], memory["tokens"], memory["bytes"]) == ("keeper's log", len(DOC), len(DOC))
    assert 0 < memory["mem_tokens"] <= memory["mem_len"] + 8  # a window: the tiny model's mem_len and segment
    assert memory["expires_at"] - memory["created_at"] in (600, 601) and memory["metadata"] == {
        "source": "test"
    }
    assert http.get(f"/v1/memories/{memory['id']}").json() == memory
    assert memory["id"] in [m["id"] for m in http.get("/v1/memories").json()["data"]]

    changed = http.patch(f"/v1/memories/{memory['id']}", json={"ttl_seconds": 9000, "name": None}).json()
    assert changed["name"] is None and changed["expires_at"] >= memory["created_at"] + 9000
    assert changed["metadata"] == {"source": "test"}
    # Its stored state, and the blocks it lists, live as long now (sessions from it may list them later).
    store = server.app.state.runtime.service.memories.store
    listed = server.run(store.load(memory["id"])).header["blocks"]
    ttls = [server.run(store.redis.ttl(store.keys.blocks + b)) for b in listed]
    assert (
        listed
        and min(ttls) > 8000
        and server.run(store.redis.ttl(store.keys.memory_versions(memory["id"]))) > 8000
    )
    assert http.patch(f"/v1/memories/{memory['id']}", json={}).status_code == 400
    assert http.patch(f"/v1/memories/{memory['id']}", json={"ttl_seconds": None}).status_code == 400

    assert http.delete(f"/v1/memories/{memory['id']}").status_code == 204
    for response in (
        http.get(f"/v1/memories/{memory['id']}"),
        http.delete(f"/v1/memories/{memory['id']}"),
        http.patch(f"/v1/memories/{memory['id']}", json={"name": "x"}),
        http.post("/v1/sessions", json={"memory": memory["id"]}),
        http.post("/v1/score", json={"text": "x", "memory": memory["id"]}),
        http.get("/v1/memories/not-a-memory"),
    ):
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"
    # The OpenAI routes answer in OpenAI's shape.
    gone = http.post("/v1/completions", json={"prompt": "x", "memory": memory["id"]})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"text": ""}, 422, "text"),  # the schema's minLength
        ({"text": "x", "name": "n" * 129}, 422, "name"),
        ({"text": "x", "ttl_seconds": 0}, 422, "ttl_seconds"),
        ({"text": "x", "ttl_seconds": 10**9}, 400, "ttl_seconds"),
        ({"text": "x", "unknown": 1}, 422, "unknown"),
        ({"text": "\ud800"}, 400, "text"),
    ],
)
def test_bad_memory_input_is_a_clear_error(http, body, status, param):
    response = http.post(
        "/v1/memories", content=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_a_session_from_a_memory_continues_exactly_like_one_that_read_the_document(http):
    memory = _memory(http)["id"]
    # No text of its own: the memory's state as it is (a table of its blocks).
    bare = _session(http, memory=memory)
    assert (bare["tokens"], bare["version"]) == (len(DOC), 1)
    text, logprob = _continuation(http, bare["id"])
    expected = _read_it_all(http)
    assert text == expected[0] and logprob == pytest.approx(expected[1], abs=1e-5)
    # Its own text after the document.
    asked = _session(http, memory=memory, text=QUESTION, metadata={"q": 1})
    assert asked["tokens"] == len(DOC) + len(QUESTION) and asked["metadata"] == {"q": 1}
    text, logprob = _continuation(http, asked["id"])
    expected = _read_it_all(http, QUESTION)
    assert text == expected[0] and logprob == pytest.approx(expected[1], abs=1e-5)
    # A session's mem_len is its memory's.
    refused = http.post("/v1/sessions", json={"memory": memory, "mem_len": 3})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "mem_len"


def test_score_and_completions_start_from_a_memory_as_if_the_document_came_first(http):
    memory = _memory(http)["id"]
    reader = _session(http, text=DOC)["id"]
    expected = http.post(f"/v1/sessions/{reader}/append", json={"text": QUESTION}).json()["logprob"]
    scored = http.post("/v1/score", json={"text": QUESTION, "memory": memory, "token_logprobs": True}).json()
    assert scored["tokens"] == len(QUESTION) and scored["logprob"] == pytest.approx(expected, abs=1e-5)
    assert sum(scored["token_logprobs"]) == pytest.approx(expected, abs=1e-5)
    plain = http.post(
        "/v1/score", params={"memory": memory}, content=QUESTION, headers={"Content-Type": "text/plain"}
    )
    assert plain.json()["logprob"] == pytest.approx(expected, abs=1e-5)

    generated = http.post(f"/v1/sessions/{reader}/generate", json=GREEDY).json()["text"]
    completion = http.post(
        "/v1/completions",
        json={"prompt": QUESTION, "memory": memory, "max_tokens": 24, "temperature": 0, "n": 2},
    ).json()
    assert [c["text"] for c in completion["choices"]] == [generated, generated]
    both = http.post("/v1/completions", json={"prompt": "x", "memory": memory, "session_id": reader})
    assert both.status_code == 400 and both.json()["error"]["param"] == "memory"


def test_a_streamed_create_reports_progress_then_the_memory(http):
    with http.stream("POST", "/v1/memories", json={"text": DOC, "stream": True, "name": "s"}) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    progress = [e for e in events if e["type"] == "progress"]
    assert progress and progress[-1]["tokens_done"] == progress[-1]["tokens_total"] == len(DOC)
    result = events[-1]
    assert result["type"] == "result" and result["object"] == "memory" and result["name"] == "s"
    assert http.get(f"/v1/memories/{result['id']}").json()["tokens"] == len(DOC)


def _memory_ids(http) -> set[str]:
    return {m["id"] for m in http.get("/v1/memories").json()["data"]}


def test_a_client_that_leaves_cancels_the_reading_and_nothing_is_created(server, http):
    memories = _memory_ids(http)
    abandon(server, http, "/v1/memories", "/v1/memories", {"text": DOC})
    # Streamed: the client leaves while the document is read.
    runner = server.app.state.runtime.service.worker.runner
    before = http.get("/metrics").text
    streamed = 'txl_requests_total{method="POST",route="/v1/memories",status="200"}'
    with Gate(runner, "run") as gate:
        send_and_leave(server, gate, "/v1/memories", json.dumps({"text": DOC, "stream": True}).encode())
        # The stream ends while the worker is still held: the reading was abandoned, not finished.
        assert wait_until(lambda: metric(http.get("/metrics").text, streamed) > metric(before, streamed))
    cancellations = metric(before, "txl_cancellations_total")
    assert wait_until(lambda: metric(http.get("/metrics").text, "txl_cancellations_total") > cancellations)
    assert wait_until(lambda: server.app.state.runtime.service.worker.active_jobs == 0)
    time.sleep(0.2)  # had the reading gone on, the memory would be registered by now
    assert _memory_ids(http) == memories


def test_deleting_a_memory_never_breaks_the_sessions_started_from_it(server, http):
    memory = _memory(http)["id"]
    sessions = [_session(http, memory=memory, text=t)["id"] for t in ("", QUESTION)]
    expected = [_read_it_all(http), _read_it_all(http, QUESTION)]
    assert http.delete(f"/v1/memories/{memory}").status_code == 204
    service = server.app.state.runtime.service
    assert memory not in service.cache  # this process let its copy go; the sessions hold the blocks
    for session, (text, logprob) in zip(sessions, expected, strict=True):
        got = _continuation(http, session)
        assert got[0] == text and got[1] == pytest.approx(logprob, abs=1e-5)
    # Read back from Redis too (as a restart or another replica would): the blocks are still there.
    for session in sessions:
        server.run(_drop_from_cache(service, session))
        assert http.post(f"/v1/sessions/{session}/generate", json=GREEDY).status_code == 200


async def _drop_from_cache(service, session_id: str) -> None:
    service.cache.drop(session_id)


def test_tenants_cannot_see_or_use_each_others_memories(tiny_model_dir, redis_server):
    settings = Settings(
        model=tiny_model_dir,
        redis_url=redis_server.url,
        redis_prefix=f"memories-tenants-{uuid.uuid4().hex[:6]}:",
        api_keys="key-a,key-b",
    )
    with LiveServer(settings) as live, live.client("key-a") as a, live.client("key-b") as b:
        memory = _memory(a, "private document")["id"]
        assert b.get("/v1/memories").json()["data"] == []
        for response in (
            b.get(f"/v1/memories/{memory}"),
            b.patch(f"/v1/memories/{memory}", json={"name": "mine"}),
            b.delete(f"/v1/memories/{memory}"),
            b.post("/v1/sessions", json={"memory": memory}),
            b.post("/v1/score", json={"text": "x", "memory": memory}),
            b.post("/v1/completions", json={"prompt": "x", "memory": memory, "max_tokens": 1}),
        ):
            assert response.status_code == 404, response.text
        assert a.get(f"/v1/memories/{memory}").json()["name"] is None  # untouched
        assert _session(a, memory=memory)["tokens"] == len("private document")


def test_a_tenant_has_a_memory_limit(tiny_model_dir, redis_server):
    settings = Settings(
        model=tiny_model_dir,
        redis_url=redis_server.url,
        redis_prefix=f"memories-limit-{uuid.uuid4().hex[:6]}:",
        max_memories_per_tenant=2,
    )
    with LiveServer(settings) as live, live.client() as http:
        first = _memory(http, "one")["id"]
        _memory(http, "two")
        refused = http.post("/v1/memories", json={"text": "three"})
        assert refused.status_code == 400 and "memory limit" in refused.json()["error"]["message"]
        http.delete(f"/v1/memories/{first}")
        _memory(http, "three")


def test_memories_survive_a_restart_and_serve_another_replica(tiny_model_dir, redis_server):
    """Whatever the sessions' persistence mode (here "evict"), memories are in Redis: a new process on the same
    Redis, and a second replica beside the first, start sessions from one exactly, reading it once each."""
    values = dict(
        model=tiny_model_dir,
        redis_url=redis_server.url,
        redis_prefix=f"memories-restart-{uuid.uuid4().hex[:6]}:",
        persistence=Persistence.EVICT,
    )
    with LiveServer(Settings(**values)) as first, first.client() as http:
        memory = _memory(http)["id"]
        expected = _read_it_all(http, QUESTION)
    with LiveServer(Settings(**values)) as restarted, restarted.client() as http:
        assert http.get(f"/v1/memories/{memory}").json()["tokens"] == len(DOC)
        got = _continuation(http, _session(http, memory=memory, text=QUESTION)["id"])
        assert got[0] == expected[0] and got[1] == pytest.approx(expected[1], abs=1e-5)
        with LiveServer(Settings(**values)) as replica, replica.client() as other:
            store = replica.app.state.runtime.service.memories.store
            loads = _count_calls(store, "load")
            with ThreadPoolExecutor(8) as pool:
                made = list(pool.map(lambda _: _start(replica, memory), range(8)))
            assert all(code == 201 for code in made) and loads() == 1  # read once, then shared
            got = _continuation(other, _session(other, memory=memory, text=QUESTION)["id"])
            assert got[0] == expected[0] and got[1] == pytest.approx(expected[1], abs=1e-5)
            # Deleted on one replica, gone on the other.
            assert http.delete(f"/v1/memories/{memory}").status_code == 204
            assert other.post("/v1/sessions", json={"memory": memory}).status_code == 404


@pytest.mark.slow
def test_a_memory_outlives_its_server_process(tiny_model_dir, redis_server, tmp_path):
    """A real process killed (no shutdown) after making a memory: a new process on the same Redis starts sessions
    from it exactly. Persistence "none": memories are in Redis whatever the sessions' mode."""
    env = {**process_env(tiny_model_dir, redis_server.url, "memories-process"), "TXL_PERSISTENCE": "none"}
    first = ServerProcess(tmp_path / "first.log", **env, TXL_LEASE_TTL_SECONDS="2").start()
    try:
        with first.client() as http:
            memory = _memory(http)["id"]
            expected = _read_it_all(http, QUESTION)
    finally:
        first.kill()
    second = ServerProcess(tmp_path / "second.log", **env, TXL_LEASE_TTL_SECONDS="2").start()
    try:
        with second.client() as http:
            got = _continuation(http, _session(http, memory=memory, text=QUESTION)["id"])
    finally:
        second.stop()
    assert got[0] == expected[0] and got[1] == pytest.approx(expected[1], abs=1e-5)


def _start(server: LiveServer, memory: str) -> int:
    with server.client() as client:
        return client.post("/v1/sessions", json={"memory": memory, "text": QUESTION}).status_code


def _count_calls(owner, name: str):
    original, calls = getattr(owner, name), [0]
    lock = threading.Lock()

    async def counted(*args, **kwargs):
        with lock:
            calls[0] += 1
        return await original(*args, **kwargs)

    setattr(owner, name, counted)
    return lambda: calls[0]


def test_a_thousand_sessions_from_one_memory_hold_one_copy_of_its_blocks(tiny_model_dir, redis_server):
    """On the device the sessions add no byte (their state is the memory's); in Redis each lists the memory's
    blocks, stored once. Each block counts every listing; deleting everything leaves nothing behind."""
    settings = Settings(
        model=tiny_model_dir,
        redis_url=redis_server.url,
        redis_prefix=f"memories-1000-{uuid.uuid4().hex[:6]}:",
        persistence=Persistence.ALWAYS,
    )
    with LiveServer(settings) as live, live.client() as http:
        service = live.app.state.runtime.service
        redis, prefix = service.store.redis, service.store.keys.blocks
        memory = _memory(http)["id"]
        live.run(live.app.state.runtime.worker.call(lambda: None))
        used, blocks = service.cache.used("device"), service.worker.pool.used_blocks
        header = live.run(service.memories.store.load(memory)).header
        listed = set(header["blocks"])
        assert live.run(_keys(redis, prefix)) == {prefix + b for b in listed}

        # Through the server's own service, 10 at a time (what POST /v1/sessions {"memory"} calls; HTTP's
        # share of the time would be most of it, and is tested above).
        sessions = [_session(http, memory=memory)["id"]]
        sessions += live.run(_start_many(service, memory, 999))
        live.run(live.app.state.runtime.worker.call(lambda: None))
        assert service.cache.used("device") == used and service.worker.pool.used_blocks == blocks
        assert live.run(_keys(redis, prefix)) == {prefix + b for b in listed}
        counts = live.run(_refs(redis, prefix, listed))
        assert set(counts.values()) == {1001}  # the memory and each session list every block once

        http.delete(f"/v1/memories/{memory}")
        assert set(live.run(_refs(redis, prefix, listed)).values()) == {1000}
        for session in sessions[::400]:
            assert http.post(f"/v1/sessions/{session}/generate", json={"max_tokens": 2}).status_code == 200
        live.run(_delete_all(service, sessions))
        assert not live.run(_keys(redis, prefix))


async def _start_many(service, memory: str, n: int) -> list[str]:
    made: list[str] = []
    for at in range(0, n, 10):
        batch = (service.create(ANONYMOUS, memory=memory) for _ in range(at, min(n, at + 10)))
        made += [meta.id for meta in await asyncio.gather(*batch)]
    return made


async def _keys(redis, prefix: str) -> set[str]:
    return {k.decode() async for k in redis.scan_iter(match=prefix + "*")}


async def _refs(redis, prefix: str, blocks) -> dict[str, int]:
    return {b: int(await redis.hget(prefix + b, "n")) for b in blocks}


async def _delete_all(service, sessions) -> None:
    for at in range(0, len(sessions), 10):
        await asyncio.gather(*(service.delete(ANONYMOUS, s) for s in sessions[at : at + 10]))
