"""An Idempotency-Key's claim outlives its process by at most a lease: a retry after `kill -9` of the replica that
was running the request (a proxy's 502) runs it anew instead of answering 409 "still in progress" for a day.
tests/deploy/test_nginx.py runs the crash itself; here, the claim's lifetime on a live server."""

from __future__ import annotations

import json
import threading
import time

import redis

from tests.helpers.live_server import live_server_fixture

CLAIM_SECONDS = 1  # TXL_LEASE_TTL_SECONDS, rounded up to whole seconds


server = live_server_fixture("claims", lease_ttl_seconds=CLAIM_SECONDS)


def idempotency_record(server, key: str) -> tuple[dict | None, int]:
    """(the stored record, its remaining time to live in ms) of an Idempotency-Key."""
    settings = server.app.state.settings
    client = redis.Redis.from_url(settings.redis_url)
    try:
        (name,) = client.keys(f"{settings.redis_prefix}i:*{key}")
        raw = client.get(name)
        return (json.loads(raw) if raw else None), client.pttl(name)
    finally:
        client.close()


def test_a_running_keyed_step_claims_its_key_for_a_lease_and_renews_it(server):
    with server.client() as client:
        session_id = client.post("/v1/sessions", json={"text": "Claimed"}).json()["id"]
        key = "claim-renewed-1"
        done = threading.Event()

        def generate():
            response = client.post(
                f"/v1/sessions/{session_id}/generate",
                json={"max_tokens": 1000, "temperature": 0},
                headers={"Idempotency-Key": key},
            )
            assert response.status_code == 200, response.text
            done.set()

        worker = threading.Thread(target=generate)
        worker.start()
        deadline = time.monotonic() + 10
        while True:
            try:
                record, ttl_ms = idempotency_record(server, key)
                break
            except ValueError:  # not claimed yet
                assert time.monotonic() < deadline
                time.sleep(0.01)
        assert record["state"] == "pending" and 0 < ttl_ms <= CLAIM_SECONDS * 1000
        time.sleep(2.5 * CLAIM_SECONDS)  # longer than the claim: only renewal keeps it
        if not done.is_set():
            record, ttl_ms = idempotency_record(server, key)
            assert record["state"] == "pending" and 0 < ttl_ms <= CLAIM_SECONDS * 1000
        worker.join(timeout=60)
        assert done.is_set()
        record, ttl_ms = idempotency_record(server, key)
        # The answer is kept for the whole idempotency TTL (a day), for retries whose response was lost.
        assert record["state"] == "done" and ttl_ms > 3600 * 1000
        again = client.post(
            f"/v1/sessions/{session_id}/generate",
            json={"max_tokens": 1000, "temperature": 0},
            headers={"Idempotency-Key": key},
        )
        assert again.status_code == 200 and again.json()["session"]["version"] == 2


def test_a_claim_whose_holder_is_gone_lapses(server):
    """A claim is only renewed while its request runs: one left behind (as by a dead process) expires."""
    with server.client() as client:
        session_id = client.post("/v1/sessions", json={"text": "Abandoned"}).json()["id"]
    store = server.app.state.runtime.service.idempotency
    key = f"POST /v1/sessions/{session_id}/append:abandoned-1"
    assert server.run(store.claim("anonymous", key, CLAIM_SECONDS, "x"))
    assert server.run(store.renew("anonymous", key, CLAIM_SECONDS, "x"))
    assert not server.run(store.renew("anonymous", key, CLAIM_SECONDS, "another request"))
    time.sleep(CLAIM_SECONDS + 0.2)
    assert server.run(store.get("anonymous", key)) is None
    assert not server.run(store.renew("anonymous", key, CLAIM_SECONDS, "x"))
