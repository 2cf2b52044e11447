"""Steps on a busy session wait for its writer (TXL_LEASE_WAIT_SECONDS) before answering 409, and a 409 says
when to retry. In this process requests take turns in order; a writer elsewhere (another replica, or one that
died with its lease) is waited for by polling the lease in Redis."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
from txl_server.errors import Conflict
from txl_server.sessions.request_queue import RequestQueues

from tests.helpers.live_server import LiveServer, client_fixture, live_server_fixture

# A wait long enough for 20 small steps on a loaded 2-core machine; the default is a few seconds.
server = live_server_fixture("lease", lease_wait_seconds=30)
impatient = live_server_fixture("lease0", lease_wait_seconds=0.3)
client = client_fixture()


def hold_lease(server: LiveServer, redis_url: str, session_id: str, ms: int) -> None:
    """Takes the session's lease as a writer in another replica would."""
    prefix = server.app.state.settings.redis_prefix
    with redis.Redis.from_url(redis_url) as r:
        assert r.set(f"{prefix}l:{session_id}", "elsewhere", nx=True, px=ms)


def test_twenty_parallel_appends_on_one_session_are_serialised(server, client):
    session = client.post("/v1/sessions", json={"text": "start"}).json()
    results = []
    barrier = threading.Barrier(20)

    def append(i: int) -> None:
        with server.client() as own:
            barrier.wait()
            results.append(own.post(f"/v1/sessions/{session['id']}/append", json={"text": f" {i:02d}"}))

    threads = [threading.Thread(target=append, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200] * 20, [r.text for r in results if r.status_code != 200]
    versions = sorted(r.json()["session"]["version"] for r in results)
    assert versions == list(range(session["version"] + 1, session["version"] + 21))  # one after the other
    after = client.get(f"/v1/sessions/{session['id']}").json()
    assert after["version"] == session["version"] + 20 and after["tokens"] == session["tokens"] + 20 * 3
    assert server.app.state.runtime.service.steps.queues.__len__() == 0  # no queue left behind


def test_a_writer_elsewhere_is_waited_for(server, client, redis_server):
    session = client.post("/v1/sessions", json={"text": "start"}).json()
    hold_lease(server, redis_server.url, session["id"], ms=600)
    started = time.monotonic()
    response = client.post(f"/v1/sessions/{session['id']}/append", json={"text": "after"})
    assert response.status_code == 200 and time.monotonic() - started >= 0.5
    assert response.json()["session"]["version"] == session["version"] + 1


def test_past_the_wait_the_409_carries_retry_after(impatient, redis_server):
    with impatient.client() as client:
        session = client.post("/v1/sessions", json={"text": "start"}).json()
        hold_lease(impatient, redis_server.url, session["id"], ms=10_000)
        started = time.monotonic()
        response = client.post(f"/v1/sessions/{session['id']}/append", json={"text": "x"})
        waited = time.monotonic() - started
        assert response.status_code == 409 and response.headers["Retry-After"] == "1"
        assert (
            response.json()["error"]["type"] == "conflict"
            and "another request" in response.json()["error"]["message"]
        )
        assert waited >= 0.3
        # A session of another tenant is 404 at once: it never queues behind (or reveals) a busy one.
        assert client.post("/v1/sessions/nope/append", json={"text": "x"}).status_code == 404
        assert client.get(f"/v1/sessions/{session['id']}").json()["version"] == session["version"]


async def test_turns_are_first_come_first_served_and_a_wait_has_an_end():
    turns, order = RequestQueues(), []

    async def step(name: str, hold: float, wait: float = 5.0) -> None:
        async with turns.first_in_line("owner", "s", wait_seconds=wait):
            order.append(name)
            await asyncio.sleep(hold)

    first = asyncio.create_task(step("first", 0.2))
    await asyncio.sleep(0)
    queued = [asyncio.create_task(step(f"then-{i}", 0.01)) for i in range(3)]
    with pytest.raises(Conflict, match=r"within 0\.05 s"):
        await step("late", 0, wait=0.05)
    with pytest.raises(Conflict, match="retry when it has finished"):
        await step("no wait", 0, wait=0)
    async with turns.first_in_line(
        "other owner", "s", wait_seconds=0
    ):  # another tenant's key never queues here
        pass
    await asyncio.gather(first, *queued)
    assert order == ["first", "then-0", "then-1", "then-2"] and len(turns) == 0
    async with turns.first_in_line("owner", "s", wait_seconds=0):  # free again, without waiting
        pass
