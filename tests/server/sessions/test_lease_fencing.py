"""A step holds its session's lease or changes nothing: a writer paused past its lease is fenced off by the commit
script itself, and a step whose lease cannot be kept ends at once (409 `lease_lost`), nothing committed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.live_server import LiveServer, serve
from tests.helpers.sse import sse_events

LEASE_TTL = 1.0


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server) -> Iterator[LiveServer]:
    yield from serve(tiny_model_dir, redis_server.url, "fencing", lease_ttl_seconds=LEASE_TTL)


class PausedCommit:
    """The session store's commit script, made to wait `pause` seconds before the next commit is sent (a writer
    descheduled, or stuck in a long GC pause, between its step and its commit)."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.pause = 0.0
        self.waiting = threading.Event()

    async def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        if self.pause:
            pause, self.pause = self.pause, 0.0
            self.waiting.set()
            await asyncio.sleep(pause)
        return await self.script(keys=keys, args=args, client=client)


def test_a_writer_paused_past_its_lease_is_fenced_off_and_the_next_writer_wins(server):
    store = server.app.state.runtime.service.store
    paused = PausedCommit(store._commit)
    store._commit = paused
    try:
        with server.client() as client, server.client() as other:
            created = client.post("/v1/sessions", json={"text": "Fenced."}).json()
            sid = created["id"]
            paused.pause = LEASE_TTL + 1.5
            first: dict[str, Any] = {}
            thread = threading.Thread(
                target=lambda: first.update(
                    response=client.post(f"/v1/sessions/{sid}/append", json={"text": " first"})
                )
            )
            thread.start()
            assert paused.waiting.wait(10)
            # The paused writer's lease runs out; this one waits for it (TXL_LEASE_WAIT_SECONDS), then commits.
            second = other.post(f"/v1/sessions/{sid}/append", json={"text": " second"})
            assert second.status_code == 200, second.text
            thread.join(30)
            response = first["response"]
            assert response.status_code == 409, response.text
            assert response.json()["error"]["code"] == "lease_lost"
            meta = client.get(f"/v1/sessions/{sid}").json()
            assert meta["version"] == 2 and meta["tokens"] == created["tokens"] + len(" second")
            versions = client.get(f"/v1/sessions/{sid}/versions").json()["data"]
            assert [v["kind"] for v in versions] == ["append", "create"]
    finally:
        store._commit = paused.script


def test_a_step_whose_lease_cannot_be_kept_ends_at_once_and_commits_nothing(server):
    leases = server.app.state.runtime.service.steps.leases
    renew = leases.renew

    async def taken(lease: Any) -> bool:
        return False  # another writer holds it now

    leases.renew = taken
    try:
        with server.client() as client:
            created = client.post("/v1/sessions", json={"text": "Lost lease."}).json()
            sid = created["id"]
            with client.stream(
                "POST", f"/v1/sessions/{sid}/generate", json={"max_tokens": 4000, "stream": True}
            ) as response:
                assert response.status_code == 200
                events = sse_events(response)
            errors = [e for e in events if isinstance(e, dict) and e.get("type") == "error"]
            assert errors and errors[0]["error"]["code"] == "lease_lost", events[-3:]
            tokens = [e for e in events if isinstance(e, dict) and e.get("type") == "token"]
            assert len(tokens) < 4000  # ended at once, not at its end
            assert client.get(f"/v1/sessions/{sid}").json()["version"] == created["version"]
            metrics = client.get("/metrics").text
            assert "txl_lease_lost_total 1.0" in metrics
    finally:
        leases.renew = renew
