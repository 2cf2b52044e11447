"""Debian's nginx with deploy/nginx in front of real replicas (`python -m txl_server` processes on the tiny test
model, one Redis, persistence `always`), driven by the SDK as a client would: what docs/deploy.md's "Several
hosts: nginx in front of the replicas" promises.

The tests share one cluster and run in order, each leaving it as the next expects: three replicas; a fourth added
(scale-out); one drained (SIGTERM); one killed (SIGKILL).
"""

from __future__ import annotations

import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from txl_client import Client, calls
from txl_server.sessions.redis_server import free_port
from txl_server.sessions.service import new_session_id

from tests.helpers.metrics import metric
from tests.helpers.server_process import ServerProcess
from tests.helpers.sse import sse_payloads

from .nginx import Nginx, nginx_binary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (.ci/run installs Debian's)"),
]

LEASE_TTL_SECONDS = 2  # a killed writer's lease: short, so that the test does not wait the default 10 s


class Cluster:
    """Replicas by name (r0, r1, ...) on one Redis, and nginx in front of the live ones."""

    def __init__(self, workdir: Path, model_dir: Path, redis_url: str) -> None:
        self.workdir = workdir
        self.env = {
            "TXL_MODEL": str(model_dir),
            "TXL_REDIS_URL": redis_url,
            "TXL_REDIS_PREFIX": f"nginx-{uuid.uuid4().hex[:6]}:",
            "TXL_PERSISTENCE": "always",
            "TXL_LEASE_TTL_SECONDS": str(LEASE_TTL_SECONDS),
            "TXL_SHUTDOWN_GRACE_SECONDS": "30",  # for servers that have the setting; others ignore it
        }
        self.replicas: dict[str, ServerProcess] = {}
        self.upstream: list[str] = []  # the replicas nginx sends to
        self.nginx: Nginx | None = None

    def start(self, *names: str) -> None:
        """Starts replicas side by side (each imports torch and loads the model: seconds each)."""
        started = {
            name: ServerProcess(self.workdir / f"{name}.log", TXL_REPLICA_ID=name, **self.env)
            for name in names
        }
        failures: list[BaseException] = []

        def start(server: ServerProcess) -> None:
            try:
                server.start(timeout=120)
            except BaseException as exc:  # reported below, in the test's thread
                failures.append(exc)

        threads = [threading.Thread(target=start, args=(s,)) for s in started.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.replicas.update(started)
        if failures:
            raise failures[0]

    def live(self) -> list[str]:
        """The replicas in the upstream whose process runs."""
        return [n for n in self.upstream if self.replicas[n].process.poll() is None]  # type: ignore[union-attr]

    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{self.replicas[n].port}" for n in self.live()]

    def reload(self, upstream: list[str]) -> None:
        """Points nginx at `upstream` (replica names), as an operator edits upstream.conf and reloads."""
        assert self.nginx is not None
        self.upstream = upstream
        self.nginx.reload(self.addresses())

    @property
    def url(self) -> str:
        assert self.nginx is not None
        return self.nginx.url

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60)

    def client(self, **options: Any) -> Client:
        return Client(self.url, **options)

    def stop(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()
        for server in self.replicas.values():
            server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model_dir, redis_server):
    workdir = tmp_path_factory.mktemp("nginx-cluster")
    cluster = Cluster(workdir, tiny_model_dir, redis_server.url)
    try:
        # r3 starts now too (beside the others, it costs less than on its own later), idle until the
        # scale-out test adds it to the upstream.
        cluster.start("r0", "r1", "r2", "r3")
        cluster.upstream = ["r0", "r1", "r2"]
        cluster.nginx = Nginx(workdir / "nginx", cluster.addresses(), free_port()).start()
        yield cluster
    finally:
        cluster.stop()


# ---------------------------------------------------------------------------------------------- helpers


def replica_of(http: httpx.Client, session_id: str) -> str:
    """The replica the proxy sends `session_id`'s requests to (any id: an unknown one answers 404, cheaply)."""
    response = http.get(f"/v1/sessions/{session_id}")
    assert response.status_code in (200, 404), response.text
    return response.headers["x-txl-replica"]


def script(client: Client, session_id: str, seed: int) -> tuple[float, list[tuple[int, float]]]:
    """An append and a sampled, streamed generation: the append's log-probability and every (token, log p)."""
    appended = client.append(session_id, " Then the wind rose.")
    with client.generate(session_id, max_tokens=12, temperature=0.9, seed=seed, stream=True) as stream:
        tokens = [(event.id, event.logprob) for event in stream]
    return appended.logprob, tokens


def sessions_on(cluster: Cluster, http: httpx.Client, client: Client, replica: str, n: int) -> list[str]:
    """`n` new sessions whose requests the proxy sends to `replica` (a session's first request lands anywhere:
    its id is not known yet)."""
    found: list[str] = []
    for i in range(60):
        session = client.create_session(text=f"Session {i} of the tale.")
        if replica_of(http, session.id) == replica:
            found.append(session.id)
            if len(found) == n:
                return found
    raise AssertionError(f"no {n} sessions hashed to {replica} out of 60")


def wait_until_refused(port: int, timeout: float = 10) -> bool:
    """Whether the server on `port` stops accepting connections within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        except OSError:
            pass
        time.sleep(0.02)
    return False


def routes(http: httpx.Client, ids: list[str]) -> dict[str, str]:
    return {i: replica_of(http, i) for i in ids}


# ---------------------------------------------------------------------------------------------- tests


def test_a_session_sticks_to_one_replica_and_body_addressed_requests_follow_it(cluster):
    with cluster.http() as http, cluster.client() as client:
        ids = [new_session_id() for _ in range(90)]
        first = routes(http, ids)
        assert routes(http, ids) == first  # every id, every time, to one replica
        assert set(first.values()) == {"r0", "r1", "r2"}  # and the ids spread over all of them
        model = client.models()[0].id
        for i in range(3):
            session = client.create_session(text=f"Sticky session {i}.")
            home = replica_of(http, session.id)
            seen = {replica_of(http, session.id)}
            appended = http.post(f"/v1/sessions/{session.id}/append", json={"text": " More."})
            seen.add(appended.headers["x-txl-replica"])
            with http.stream(
                "POST", f"/v1/sessions/{session.id}/generate", json={"max_tokens": 4, "stream": True}
            ) as stream:
                stream.read()
                seen.add(stream.headers["x-txl-replica"])
            # /v1/completions names its session in the body: the SDK's header lets the proxy see it.
            body = {"model": model, "prompt": " And", "max_tokens": 2, "session_id": session.id}
            headers = calls.Call("POST", "/v1/completions", body).request_headers()
            completion = http.post("/v1/completions", json=body, headers=headers)
            assert completion.status_code == 200, completion.text
            seen.add(completion.headers["x-txl-replica"])
            assert seen == {home}, (session.id, seen)
        # Requests that name no session spread over the replicas (their key is the request id).
        spread = {
            http.post("/v1/score", json={"text": "Spread me."}).headers["x-txl-replica"] for _ in range(12)
        }
        assert len(spread) >= 2, spread


def test_a_conversations_requests_follow_its_session_by_path_or_x_session_id(cluster):
    with cluster.http() as http:
        for _ in range(3):
            conversation = http.post("/v1/conversations", json={}).json()
            home = replica_of(http, conversation["id"].removeprefix("conv_"))
            headers = {
                "X-Session-Id": conversation["id"]
            }  # llm-d's header: the body's conversation is unseen
            body = {"conversation": conversation["id"], "input": "On", "max_output_tokens": 2}
            seen = set()
            for _ in range(3):
                reply = http.post("/v1/responses", json=body, headers=headers)
                assert reply.status_code == 200, reply.text
                seen.add(reply.headers["x-txl-replica"])
                polled = http.get(f"/v1/responses/{reply.json()['id']}")
                seen.add(polled.headers["x-txl-replica"])
            seen.add(http.get(f"/v1/conversations/{conversation['id']}/items").headers["x-txl-replica"])
            assert seen == {home}


def test_adding_a_replica_moves_about_a_quarter_of_the_sessions_and_loses_none(cluster):
    with cluster.http() as http, cluster.client() as client:
        ids = [new_session_id() for _ in range(200)]
        before = routes(http, ids)
        sessions = [client.create_session(text=f"Scaling story {i}.") for i in range(4)]
        twins = [client.fork_session(s.id) for s in sessions]  # the same committed state, for reference
        homes = {s.id: replica_of(http, s.id) for s in sessions}

        cluster.reload(["r0", "r1", "r2", "r3"])

        after = routes(http, ids)
        moved = [i for i in ids if after[i] != before[i]]
        # Consistent hashing: the only moves are onto the new replica, about 1/4 of the ids (each replica holds
        # 160 points of the ring, so its share is 1/4 give or take a few hundredths).
        assert {after[i] for i in moved} == {"r3"}
        assert 0.10 <= len(moved) / len(ids) <= 0.45, len(moved)
        # No session is lost: each continues exactly as its untouched twin does, whether it moved (and loaded its
        # memory from Redis) or not.
        for i, (session, twin) in enumerate(zip(sessions, twins, strict=True)):
            assert script(client, session.id, seed=100 + i) == script(client, twin.id, seed=100 + i)
            assert client.get_session(session.id).version == session.version + 2
        assert {replica_of(http, s.id) for s in sessions} <= set(homes.values()) | {"r3"}


def test_draining_a_replica_finishes_its_streams_before_it_exits(cluster):
    """SIGTERM: the replica stops taking connections (the proxy sends its sessions' new requests to the next
    replica on the ring) and finishes the streams it is running before it exits."""
    assert cluster.nginx is not None
    victim = cluster.replicas["r1"]
    with cluster.http() as http, cluster.client(max_retries=6) as client:
        streamed, other = sessions_on(cluster, http, client, "r1", 2)
        # About a second on the tiny model (a few under load): under way at SIGTERM, done well within the
        # grace period (uvicorn's 10 s; TXL_SHUTDOWN_GRACE_SECONDS once the server has its own).
        max_tokens = 600
        with http.stream(
            "POST",
            f"/v1/sessions/{streamed}/generate",
            json={"max_tokens": max_tokens, "temperature": 0.8, "seed": 3, "stream": True},
        ) as stream:
            assert stream.headers["x-txl-replica"] == "r1"
            lines = stream.iter_lines()
            head = [next(lines) for _ in range(8)]  # the stream is under way
            victim.process.terminate()
            refusing = wait_until_refused(victim.port)
            # Meanwhile the draining replica's other sessions are served elsewhere.
            assert client.get_session(other).id == other
            assert replica_of(http, other) != "r1"
            rest = list(lines)
        events = sse_payloads(head + rest)
        assert events[-1] == "[DONE]" and events[-2]["type"] == "done", (events[-3:], victim.log())
        assert sum(e["type"] == "token" for e in events[:-1]) == max_tokens
        assert events[-2]["usage"]["completion_tokens"] == max_tokens
        assert refusing, "the draining replica kept taking connections"
        # A clean exit after the stream: status 0, or uvicorn's own re-raised SIGTERM; no traceback.
        assert victim.process.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "Traceback" not in victim.log(), victim.log()
        assert client.get_session(streamed).version == 2  # the finished stream committed
    cluster.reload(cluster.live())  # the operator takes it out of the upstream


def test_kill_9_its_sessions_continue_exactly_on_another_replica_with_at_most_one_retry(cluster):
    """SIGKILL of a replica with one step in flight and idle sessions: the in-flight step's client gets one 502
    from the proxy (or loses its stream) and retries it with its Idempotency-Key (then waits out the dead writer's lease); every other
    request is sent on by the proxy without the client noticing. Every session continues with exactly the tokens
    and log-probabilities its untouched twin gets."""
    victim_name = cluster.live()[0]
    victim = cluster.replicas[victim_name]
    others = [n for n in cluster.live() if n != victim_name]
    with cluster.http() as http, cluster.client() as setup:
        on_victim = sessions_on(cluster, http, setup, victim_name, 2)
        elsewhere = sessions_on(cluster, http, setup, others[0], 1)
        twins = {s: setup.fork_session(s).id for s in on_victim + elsewhere}
        in_flight = on_victim[0]
        big = {"max_tokens": 400, "temperature": 0.8, "seed": 5}  # ~2 s: killed within its first 0.1 s
        expected_big = setup.generate(twins[in_flight], **big).text
        expected = {s: script(setup, twins[s], seed=7) for s in twins}

    clients = {s: cluster.client(max_retries=8) for s in twins}
    outcome: dict[str, Any] = {}

    def step_in_flight() -> None:
        try:
            outcome["big"] = clients[in_flight].generate(in_flight, **big).text
        except BaseException as exc:  # checked below
            outcome["error"] = exc

    runner = threading.Thread(target=step_in_flight)
    runner.start()
    with httpx.Client(base_url=victim.url, timeout=10) as direct:
        deadline = time.monotonic() + 30
        while metric(direct.get("/metrics").text, "txl_num_requests_running") < 1:
            assert time.monotonic() < deadline, "the step never started on the victim"
            time.sleep(0.02)
    victim.kill()
    runner.join(timeout=120)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["big"] == expected_big

    for session_id, client in clients.items():
        assert script(client, session_id, seed=7) == expected[session_id], session_id
    with cluster.http() as http:
        assert {replica_of(http, s) for s in on_victim} <= set(others)
    for session_id, client in clients.items():
        failures = {r: n for r, n in client.retries.by_reason().items() if r != "409"}
        if session_id == in_flight:
            # One retry (and 409s while the lease ran out): a 502 if the replica died before its answer began,
            # a lost connection if it died with the answer (a stream) under way.
            assert failures in ({"502": 1}, {"connection": 1}), client.retries.by_reason()
        else:
            assert client.retries.total == 0, (session_id, client.retries.by_reason())
        client.close()
