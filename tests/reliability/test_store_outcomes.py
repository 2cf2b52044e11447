"""The store never lies about a commit: Redis stopped (SIGSTOP) as a step commits, then resumed, and the same
Idempotency-Key sent again. Every step is applied exactly once and reported truthfully: applied (200), not
applied (503, "nothing was changed"), or unknown (503 `outcome_unknown`) and then settled by the retry.

The server runs in this process with a Redis of its own (so that the test can stop it), a short socket timeout and
lease: a commit that gets no answer within 0.5 s is settled once Redis answers, waiting at most the lease's TTL
(2 s) plus a second.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from txl_server.sessions.redis_server import EmbeddedRedis, free_port

from tests.helpers.live_server import LiveServer, live_settings
from tests.helpers.sse import sse_payloads

pytestmark = pytest.mark.slow

LEASE_TTL = 2.0
TIMEOUT = 0.5


class StopAtCommit:
    """Wraps the session store's commit script: the next commit sent finds Redis stopped (SIGSTOP), which
    resumes (SIGCONT) `resume_after` seconds later."""

    def __init__(self, script: Any, redis: EmbeddedRedis) -> None:
        self.script = script
        self.pid = redis.process.pid if redis.process is not None else 0
        self.resume_after: float | None = None
        self.resumed = threading.Event()

    def arm(self, resume_after: float) -> None:
        self.resume_after = resume_after
        self.resumed.clear()

    async def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        if self.resume_after is not None:
            pause, self.resume_after = self.resume_after, None
            os.kill(self.pid, signal.SIGSTOP)
            threading.Timer(pause, self._resume).start()
        return await self.script(keys=keys, args=args, client=client)

    def _resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.resumed.set()


@pytest.fixture
def stopped_redis(tiny_model_dir, tmp_path) -> Iterator[tuple[LiveServer, StopAtCommit]]:
    redis = EmbeddedRedis(tmp_path / "redis", port=free_port())
    redis.start()
    settings = live_settings(
        "outcomes",
        model=tiny_model_dir,
        redis_url=redis.url,
        redis_timeout_seconds=TIMEOUT,
        lease_ttl_seconds=LEASE_TTL,
    )
    try:
        with LiveServer(settings) as live:
            store = live.app.state.runtime.service.store
            hook = StopAtCommit(store._commit, redis)
            store._commit = hook
            yield live, hook
            os.kill(hook.pid, signal.SIGCONT)
    finally:
        redis.stop()


def _session(client: httpx.Client, text: str) -> str:
    """A new session, stepped once (so that Redis has loaded the commit's script: a script Redis has not loaded
    fails when it arrives late, which is another way of not being applied)."""
    sid = client.post("/v1/sessions", json={"text": text}).json()["id"]
    assert client.post(f"/v1/sessions/{sid}/append", json={"text": " tock"}).status_code == 200
    return sid


def _record(figures: Any, fault: str, what: str, clients: str, test: str) -> None:
    """A row of docs/reliability.md's table of store faults."""
    row = {"fault": what, "clients": clients, "lost": "nothing", "test": f"test_store_outcomes.py -k {test}"}
    figures.record("store_faults", {fault: row})


def _versions(client: httpx.Client, sid: str) -> list[int]:
    body = client.get(f"/v1/sessions/{sid}/versions").json()
    return sorted(v["version"] for v in body["data"])


def _append(client: httpx.Client, sid: str, key: str) -> httpx.Response:
    return client.post(f"/v1/sessions/{sid}/append", json={"text": " tick"}, headers={"Idempotency-Key": key})


def _retry_until_answered(client: httpx.Client, send: Any, timeout: float = 20) -> httpx.Response:
    """The same request again until it is answered (409 while the first one's claim lapses, 503 while Redis
    is away)."""
    deadline = time.monotonic() + timeout
    while True:
        response = send()
        if response.status_code not in (409, 503) or time.monotonic() > deadline:
            return response
        time.sleep(0.25)


def test_a_commit_redis_ran_late_is_reported_applied_and_its_retry_replays_it(stopped_redis, figures):
    live, hook = stopped_redis
    with live.client() as client:
        sid = _session(client, "Applied late.")
        hook.arm(resume_after=1.0)  # within the lease: Redis runs the queued commit when it resumes
        started = time.monotonic()
        first = _append(client, sid, "late-1")
        answered = time.monotonic() - started
        assert first.status_code == 200, first.text
        assert first.json()["session"]["version"] == 3
        retry = _append(client, sid, "late-1")
        assert retry.status_code == 200 and retry.json() == first.json()
        assert _versions(client, sid) == [1, 2, 3]
    _record(
        figures,
        "stopped_within_lease",
        "Redis stopped (SIGSTOP) as a keyed append commits, resumed 1 s later (within the 2 s lease)",
        f"200 after {answered:.2f} s (settled as applied once Redis answered); the retry with the same key "
        "replays it",
        "test_a_commit_redis_ran_late",
    )


def test_a_commit_that_arrived_after_its_lease_is_reported_not_applied_and_its_retry_runs_once(
    stopped_redis, figures
):
    live, hook = stopped_redis
    with live.client() as client:
        sid = _session(client, "Applied never.")
        hook.arm(resume_after=LEASE_TTL + 0.6)  # past the lease: Redis refuses the queued commit
        first = _append(client, sid, "never-1")
        assert first.status_code == 503, first.text
        error = first.json()["error"]
        assert "found not applied: nothing was changed" in error["message"], error
        assert first.headers["Retry-After"]
        assert _versions(client, sid) == [1, 2]
        retry = _retry_until_answered(client, lambda: _append(client, sid, "never-1"))
        assert retry.status_code == 200 and retry.json()["session"]["version"] == 3
        assert _append(client, sid, "never-1").json() == retry.json()  # and once only
        assert _versions(client, sid) == [1, 2, 3]
    _record(
        figures,
        "stopped_past_lease",
        "Redis stopped as a keyed append commits, resumed 2.6 s later (past the 2 s lease)",
        '503 with Retry-After, "found not applied: nothing was changed" (Redis refused the late commit: its '
        "lease had expired); the retry with the same key applies it, once",
        "test_a_commit_that_arrived_after_its_lease",
    )


def test_a_commit_whose_outcome_stays_unknown_says_so_and_its_retry_applies_it_once(stopped_redis, figures):
    live, hook = stopped_redis
    with live.client() as client:
        sid = _session(client, "Unknown for a while.")
        hook.arm(resume_after=LEASE_TTL + 2.5)  # Redis answers after the settling gave up
        first = _append(client, sid, "unknown-1")
        assert first.status_code == 503, first.text
        error = first.json()["error"]
        assert error["code"] == "outcome_unknown", error
        assert "Idempotency-Key" in error["message"] and f"/v1/sessions/{sid}" in error["message"]
        assert hook.resumed.wait(10)
        retry = _retry_until_answered(client, lambda: _append(client, sid, "unknown-1"))
        assert retry.status_code == 200, retry.text
        assert _versions(client, sid) == [1, 2, 3]
        assert _append(client, sid, "unknown-1").json() == retry.json()
        assert _versions(client, sid) == [1, 2, 3]
    _record(
        figures,
        "stopped_past_settling",
        "Redis stopped as a keyed append commits, resumed 4.5 s later (past the settling's 3 s)",
        "503 `outcome_unknown` saying how to find out; the retry with the same key (409 until its claim lapsed) "
        "applies it, once",
        "test_a_commit_whose_outcome_stays_unknown",
    )


def test_a_streamed_generation_commit_redis_ran_late_ends_done_and_replays_once(stopped_redis):
    live, hook = stopped_redis
    body = {"max_tokens": 6, "temperature": 0, "stream": True}
    headers = {"Idempotency-Key": "stream-1"}
    with live.client() as client:
        sid = _session(client, "Streamed late.")
        hook.arm(resume_after=1.0)
        first = client.post(f"/v1/sessions/{sid}/generate", json=body, headers=headers)
        events = sse_payloads(first.text.splitlines())
        done = [e for e in events if isinstance(e, dict) and e.get("type") == "done"]
        assert done and done[0]["session"]["version"] == 3, events
        again = client.post(f"/v1/sessions/{sid}/generate", json=body, headers=headers)
        replayed = sse_payloads(again.text.splitlines())
        assert [e for e in replayed if isinstance(e, dict) and e.get("type") == "token"] == [
            e for e in events if isinstance(e, dict) and e.get("type") == "token"
        ]
        assert _versions(client, sid) == [1, 2, 3]
