"""Several server processes sharing one Redis: any replica serves any session, exactly; one writer at a time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from txl_server.sessions.redis_server import EmbeddedRedis

from tests.helpers.server_process import ServerProcess, kill_mid_stream
from tests.helpers.servers import redis_prefix

pytestmark = pytest.mark.slow


def replica(log_path: Path, model_dir: Path, redis_url: str, prefix: str) -> ServerProcess:
    """A started server process that serves the sessions kept under `prefix` in the Redis at `redis_url`."""
    return ServerProcess(
        log_path,
        TXL_MODEL=str(model_dir),
        TXL_REDIS_URL=redis_url,
        TXL_REDIS_PREFIX=prefix,
        TXL_PERSISTENCE="always",
        TXL_LEASE_TTL_SECONDS="2",
    ).start()


@pytest.fixture(scope="module")
def shared_redis(tmp_path_factory):
    with EmbeddedRedis(tmp_path_factory.mktemp("replica-redis")) as redis:
        yield redis


@pytest.fixture
def replicas(tiny_model_dir, shared_redis, tmp_path):
    prefix = redis_prefix("rep")
    servers = [replica(tmp_path / f"{i}.log", tiny_model_dir, shared_redis.url, prefix) for i in range(2)]
    yield servers
    for server in servers:
        server.stop()


def generate(client, session_id, **body):
    body = {"max_tokens": 16, "temperature": 0.8, "seed": 7, **body}
    response = client.post(f"/v1/sessions/{session_id}/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def run_script(clients, session_id=None):
    """The same steps, each on the given replica; returns the generated texts and the session id."""
    first = clients[0]
    if session_id is None:
        session_id = first.post("/v1/sessions", json={"text": "The sea was"}).json()["id"]
    steps = [
        lambda c: c.post(f"/v1/sessions/{session_id}/append", json={"text": " calm"}),
        lambda c: c.post(f"/v1/sessions/{session_id}/append", json={"text": " that night"}),
        lambda c: generate(c, session_id),
        lambda c: generate(c, session_id, text=" and"),
    ]
    outputs = []
    for step, client in zip(steps, clients[1:], strict=True):
        result = step(client)
        outputs.append(result["text"] if isinstance(result, dict) else result.json()["session"]["version"])
    return outputs


def test_a_session_moves_between_replicas_exactly_and_stale_copies_are_not_served(replicas):
    a, b = (s.client() for s in replicas)
    # A caches version 2, then B writes version 3: A must load version 3 from Redis, never serve its copy.
    moved = run_script([a, a, b, a, b])
    alone = run_script([a, a, a, a, a])
    assert moved == alone
    assert moved[:2] == [2, 3]


def test_concurrent_steps_on_two_replicas_take_turns_through_the_lease(replicas):
    """The second waits for the first's lease in Redis (TXL_LEASE_WAIT_SECONDS), then steps from its commit."""
    a, b = (s.client() for s in replicas)
    session = a.post("/v1/sessions", json={"text": "race"}).json()
    results = {}

    def append(name, client):
        results[name] = client.post(f"/v1/sessions/{session['id']}/append", json={"text": "x" * 3000})

    threads = [threading.Thread(target=append, args=(n, c)) for n, c in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results.values())
    assert codes == [200, 200], [r.text for r in results.values()]
    versions = sorted(r.json()["session"]["version"] for r in results.values())
    assert versions == [session["version"] + 1, session["version"] + 2]
    after = a.get(f"/v1/sessions/{session['id']}").json()
    assert after["version"] == session["version"] + 2 and after["tokens"] == session["tokens"] + 6000


def test_killing_a_replica_mid_step_leaves_every_committed_session_to_the_other(replicas):
    server_a, server_b = replicas
    a, b = server_a.client(), server_b.client()
    committed = {}
    for i in range(3):
        session = a.post("/v1/sessions", json={"text": f"Session {i} begins."}).json()
        step = generate(a, session["id"], max_tokens=8)
        twin = a.post(
            f"/v1/sessions/{session['id']}/fork"
        ).json()  # the same committed state, untouched below
        committed[session["id"]] = (step["session"]["version"], twin["id"])
    victim = next(iter(committed))
    # A long stream on A, killed after its first tokens: that step never commits.
    kill_mid_stream(server_a, a, victim, after_lines=4)
    for session_id, (version, twin) in committed.items():
        assert b.get(f"/v1/sessions/{session_id}").json()["version"] == version
        deadline = time.monotonic() + 15  # the dead writer's lease expires after its TTL
        while True:
            response = b.post(
                f"/v1/sessions/{session_id}/generate", json={"max_tokens": 12, "temperature": 0}
            )
            if response.status_code != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert response.status_code == 200, response.text
        assert response.json()["session"]["version"] == version + 1
        assert response.json()["text"] == generate(b, twin, max_tokens=12, temperature=0)["text"]


def test_export_then_import_into_another_deployment_continues_identically(replicas, tiny_model_dir, tmp_path):
    a = replicas[0].client()
    session = a.post("/v1/sessions", json={"text": "Portable memory", "metadata": {"k": "v"}}).json()
    generate(a, session["id"], max_tokens=5)
    blob = a.get(f"/v1/sessions/{session['id']}/snapshot")
    assert blob.status_code == 200 and blob.headers["content-type"] == "application/octet-stream"
    fork = a.post(f"/v1/sessions/{session['id']}/fork").json()
    expected = generate(a, fork["id"], max_tokens=20)

    with EmbeddedRedis(tmp_path / "elsewhere") as other_redis:
        other = replica(tmp_path / "other.log", tiny_model_dir, other_redis.url, "other:")
        try:
            with other.client() as c:
                imported = c.post(
                    "/v1/sessions/import",
                    content=blob.content,
                    headers={"Content-Type": "application/octet-stream"},
                )
                assert imported.status_code == 201, imported.text
                meta = imported.json()
                assert meta["tokens"] == fork["tokens"] and meta["metadata"] == {"k": "v"}
                assert meta["mem_tokens"] == fork["mem_tokens"]
                got = generate(c, meta["id"], max_tokens=20)
                assert got["text"] == expected["text"]
                bad = c.post("/v1/sessions/import", content=b"not a snapshot")
                assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request"
        finally:
            other.stop()
