"""What the docs claim about the server's answers, checked against a live one:

- docs/api.md, the session object: `mem_tokens` is the last `mem_len` positions plus those since the last
  boundary of the segment grid, the separator included, so at most `window.max_positions` of `/v1/system`
  (it was documented as at most `mem_len`, which it exceeds between boundaries);
- docs/clients.md, long work: `on_progress` is first called with 0 and last with `done == total` for append,
  create and score; for a generation whose text is longer than a segment, first at the end of the first segment
  (it was documented as 0 for every call);
- docs/server.md, one writer per session: 20 appends sent at once to one session all succeed, one after the
  other, each from the previous one's commit (docs/reliability.md said 5 of 20).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from txl_client import Client

from tests.clients.conftest import server_settings
from tests.helpers.live_server import LiveServer

TEXT = "It was the best of times, it was the worst of times. " * 6


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server):
    # A long lease wait: a loaded machine must not turn the last of 20 queued appends into 409s (the claim is that
    # they wait in line, each after the one before; the default wait is 5 s).
    settings = server_settings(tiny_model_dir, redis_server.url, lease_wait_seconds=60)
    with LiveServer(settings) as live:
        yield live


def test_mem_tokens_is_mem_len_plus_the_positions_since_the_last_grid_boundary(server):
    with server.client() as http:
        window = http.get("/v1/system").json()["serving"]["window"]
        grid, mem_len, most = window["grid"], window["mem_len"], window["max_positions"]
        session = http.post("/v1/sessions", json={"text": "A"}).json()
        seen = []
        for n in (1, 3, grid - 1, mem_len, 2 * grid + 3, 1, grid - 2):
            appended = http.post(f"/v1/sessions/{session['id']}/append", json={"text": "x" * n})
            session = appended.json()["session"]
            fed = session["tokens"] + 1  # the separator the session starts with
            assert session["mem_tokens"] == min(fed, mem_len + fed % grid), (session, window)
            assert session["mem_tokens"] <= most == mem_len + grid - 1
            seen.append(session["mem_tokens"])
    assert max(seen) > mem_len, seen  # between boundaries it holds more than mem_len


def test_progress_starts_at_zero_and_ends_at_the_total_for_every_long_call(server):
    calls: dict[str, list[tuple[int, int]]] = {}

    def recorder(name: str):
        calls[name] = []
        return lambda done, total: calls[name].append((done, total))

    with Client(server.url) as client:
        session = client.create_session(TEXT, on_progress=recorder("create"))
        client.append(session.id, TEXT, on_progress=recorder("append"))
        client.score(TEXT, on_progress=recorder("score"))
        client.generate(session.id, TEXT, max_tokens=3, on_progress=recorder("generate"))
    total = len(TEXT.encode())  # a byte-level model
    segment = server.app.state.runtime.worker.segment_len
    for name, progress in calls.items():
        assert progress[-1] == (total, total) and progress[0][1] == total, (name, progress)
        if name == "generate":  # after its first segment (which ends on the segment grid)
            assert 0 < progress[0][0] <= segment, (name, progress)
        else:
            assert progress[0][0] == 0, (name, progress)
        assert [done for done, _ in progress] == sorted(done for done, _ in progress), (name, progress)


def test_twenty_appends_at_once_to_one_session_all_succeed_one_after_another(server):
    with server.client() as http:
        session = http.post("/v1/sessions", json={"text": "many writers"}).json()

    async def appends() -> list[httpx.Response]:
        async with server.async_client(limits=httpx.Limits(max_connections=20)) as client:
            return await asyncio.gather(
                *(
                    client.post(f"/v1/sessions/{session['id']}/append", json={"text": f"[{i:02d}]"})
                    for i in range(20)
                )
            )

    answers = asyncio.run(appends())
    assert [a.status_code for a in answers] == [200] * 20, [a.text for a in answers if a.status_code != 200]
    steps = sorted((a.json() for a in answers), key=lambda body: body["session"]["version"])
    # Each committed on top of the one before: consecutive versions, the tokens adding up in that order.
    tokens = session["tokens"]
    for i, step in enumerate(steps):
        tokens += step["tokens"]
        assert step["session"]["version"] == session["version"] + i + 1
        assert step["session"]["tokens"] == tokens
