"""Session history over HTTP, on a real Redis: the versions a session keeps, rewinding to one and forking at one,
each exactly a fresh session fed the same text; versions across a restart and on another replica."""

from __future__ import annotations

import threading

import pytest
from txl.sampling import SamplingParams
from txl_server.settings import Persistence, Settings

from tests.helpers.live_server import LiveServer, client_fixture, live_server_fixture
from tests.helpers.runtimes import OWNER, generate, running

GREEDY = {"max_tokens": 24, "temperature": 0}


server = live_server_fixture("history", persistence=Persistence.ALWAYS, keep_versions=4)
http = client_fixture()


def _create(http, text: str) -> dict:
    response = http.post("/v1/sessions", json={"text": text})
    assert response.status_code == 201, response.text
    return response.json()


def _continuation(http, session_id: str) -> tuple[str, float]:
    """Greedy text after the session, and the log-prob of a fixed append after that (a fork does both, so the
    session itself is left as it is)."""
    fork = http.post(f"/v1/sessions/{session_id}/fork").json()["id"]
    text = http.post(f"/v1/sessions/{fork}/generate", json=GREEDY).json()["text"]
    logprob = http.post(f"/v1/sessions/{fork}/append", json={"text": " and then, the end."}).json()["logprob"]
    return text, logprob


def test_every_step_makes_a_version_listed_newest_first(http):
    session = _create(http, "Once upon a time")
    sid = session["id"]
    http.post(f"/v1/sessions/{sid}/append", json={"text": ", there was a lighthouse."})
    http.post(f"/v1/sessions/{sid}/generate", json={**GREEDY, "max_tokens": 5})
    listed = http.get(f"/v1/sessions/{sid}/versions").json()
    assert listed["object"] == "list"
    assert [(v["version"], v["kind"]) for v in listed["data"]] == [
        (3, "generate"),
        (2, "append"),
        (1, "create"),
    ]
    assert listed["data"][1]["text_tail"] == ", there was a lighthouse." and listed["data"][2]["tokens"] == 16
    assert listed["data"][0]["tokens"] == 16 + 25 + 5


def test_a_rewind_and_a_fork_at_a_version_continue_like_a_fresh_session_of_that_text(http):
    first, second = "The keeper climbed the stairs", " every night at nine, and lit the lamp."
    sid = _create(http, first)["id"]
    http.post(f"/v1/sessions/{sid}/append", json={"text": second})
    http.post(f"/v1/sessions/{sid}/generate", json=GREEDY)
    at_two = _continuation(http, _create(http, first + second)["id"])
    at_one = _continuation(http, _create(http, first)["id"])

    forked = http.post(f"/v1/sessions/{sid}/fork", json={"version": 1}).json()
    assert forked["tokens"] == len(first) and forked["version"] == 1
    text, logprob = _continuation(http, forked["id"])
    assert text == at_one[0] and logprob == pytest.approx(at_one[1], abs=1e-4)

    rewound = http.post(f"/v1/sessions/{sid}/rewind", json={"version": 2})
    assert rewound.status_code == 200, rewound.text
    session = rewound.json()["session"]
    assert session["version"] == 4 and session["tokens"] == len(first + second)
    text, logprob = _continuation(http, sid)
    assert text == at_two[0] and logprob == pytest.approx(at_two[1], abs=1e-4)
    # The rewind is a version too: rewinding to the generated one undoes it.
    assert http.get(f"/v1/sessions/{sid}/versions").json()["data"][0]["kind"] == "rewind"
    assert http.post(f"/v1/sessions/{sid}/rewind", json={"version": 3}).json()["session"]["version"] == 5


def test_a_version_no_longer_kept_is_not_found_and_names_the_oldest(http):
    sid = _create(http, "a")["id"]
    for i in range(5):  # versions 2..6; four are kept: 3..6
        http.post(f"/v1/sessions/{sid}/append", json={"text": f" {i}"})
    assert [v["version"] for v in http.get(f"/v1/sessions/{sid}/versions").json()["data"]] == [6, 5, 4, 3]
    for response in (
        http.post(f"/v1/sessions/{sid}/rewind", json={"version": 2}),
        http.post(f"/v1/sessions/{sid}/fork", json={"version": 9}),
    ):
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "version_not_found" and "oldest kept version is 3" in error["message"]
    assert http.get(f"/v1/sessions/{sid}").json()["version"] == 6  # nothing changed


def test_another_tenant_cannot_list_or_rewind(tiny_model_dir, redis_server):
    with (
        LiveServer(
            Settings(
                model=tiny_model_dir,
                redis_url=redis_server.url,
                redis_prefix="history-tenants:",
                api_keys="key-a,key-b",
                persistence=Persistence.ALWAYS,
            )
        ) as live,
        live.client("key-a") as a,
        live.client("key-b") as b,
    ):
        sid = _create(a, "private")["id"]
        a.post(f"/v1/sessions/{sid}/append", json={"text": " text"})
        assert b.get(f"/v1/sessions/{sid}/versions").status_code == 404
        assert b.post(f"/v1/sessions/{sid}/rewind", json={"version": 1}).status_code == 404
        assert b.post(f"/v1/sessions/{sid}/fork", json={"version": 1}).status_code == 404


def test_versions_survive_a_restart_and_serve_from_another_replica(tiny_model_dir, redis_server):
    settings = dict(
        model=tiny_model_dir,
        redis_url=redis_server.url,
        redis_prefix="history-restart:",
        persistence=Persistence.ALWAYS,
    )
    with LiveServer(Settings(**settings)) as first, first.client() as http:
        sid = _create(http, "The tide came in")["id"]
        http.post(f"/v1/sessions/{sid}/append", json={"text": " over the rocks."})
        expected = _continuation(http, _create(http, "The tide came in")["id"])
    with LiveServer(Settings(**settings)) as second, second.client() as http:
        assert [v["version"] for v in http.get(f"/v1/sessions/{sid}/versions").json()["data"]] == [2, 1]
        assert http.post(f"/v1/sessions/{sid}/rewind", json={"version": 1}).status_code == 200
        text, logprob = _continuation(http, sid)
    assert text == expected[0] and logprob == pytest.approx(expected[1], abs=1e-4)


def test_a_concurrent_rewind_and_append_one_wins(server, http):
    sid = _create(http, "race")["id"]
    http.post(f"/v1/sessions/{sid}/append", json={"text": " on"})
    results = []

    def call(path, body):
        with server.client() as client:
            results.append(client.post(f"/v1/sessions/{sid}/{path}", json=body))

    threads = [
        threading.Thread(target=call, args=("append", {"text": "z" * 3000})),
        threading.Thread(target=call, args=("rewind", {"version": 1})),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results)
    assert codes in ([200, 200], [200, 409])
    assert http.get(f"/v1/sessions/{sid}").json()["version"] == 2 + codes.count(200)


async def test_a_thousand_versions_come_and_go_without_a_leak(make_settings):
    """Budgets count a block once however many versions list it; versions pushed out free what only they held,
    in the pool and in Redis."""
    settings = make_settings(persistence=Persistence.ALWAYS, keep_versions=8, prefix_cache_bytes=0)
    async with running(settings) as rt:
        service, pool = rt.service, rt.worker.pool
        baseline = pool.used_blocks
        meta = await service.create(OWNER, text="Version zero.")
        for i in range(333):
            await service.append(OWNER, meta.id, f" {i}")
            if i % 111 == 0:
                await service.history.rewind(OWNER, meta.id, (await service.get(OWNER, meta.id)).version - 1)
        await generate(service, meta.id, max_tokens=300, sampling=SamplingParams(temperature=0))
        entry = service.cache.peek(meta.id)
        held = {b for state in entry.states() for b in state.memory.block_ids().tolist()}
        await rt.worker.call(lambda: None)
        assert len(entry.older) <= 7 and pool.used_blocks - baseline == len(held)
        assert service.cache.used("device") == len(held) * pool.block_nbytes + sum(
            s.last_hidden.numel() * 4 for s in entry.states()
        )
        redis, prefix = service.store.redis, service.store.keys.blocks
        stored = len([k async for k in redis.scan_iter(match=prefix + "*")])
        assert stored <= 8 * (len(held) + 2)
        del entry  # its states hold blocks
        await service.delete(OWNER, meta.id)
        await rt.worker.call(lambda: None)
        assert pool.used_blocks == baseline
        assert not [k async for k in redis.scan_iter(match=prefix + "*")]
