"""Admission, priority and fair share through a real HTTP server and real clients (admission/, engine/gate.py,
engine/scheduler.py, api/middleware.py): refusals at once with a computed Retry-After in the route's shape;
`service_tier` echoed on every family; a flex row that leaves the batch for default work and comes back with the
same tokens at a fixed seed; a second key's lone client served beside another key's crowd, whose slots it cannot
take, and whose rows make room (and come back with the same tokens).

Steps are slowed (the runner sleeps before each forward) where a test needs the batch to stay full."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers.live_server import LiveServer, live_settings
from tests.helpers.metrics import metric
from tests.helpers.sse import sse_events


def serve(tiny_model_dir, redis_server, name: str, **settings) -> LiveServer:
    return LiveServer(live_settings(name, model=tiny_model_dir, redis_url=redis_server.url, **settings))


@contextlib.contextmanager
def slowed(live: LiveServer, seconds: float) -> Iterator[None]:
    """Each forward of the server's worker takes `seconds` more, within the block."""
    runner = live.app.state.runtime.worker.runner
    run = runner.run

    def slowly(decode, chunks, **kwargs):
        time.sleep(seconds)
        return run(decode, chunks, **kwargs)

    runner.run = slowly
    try:
        yield
    finally:
        runner.run = run


def stream_lines(client: httpx.Client, path: str, body: dict) -> Iterator[str]:
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        yield from response.iter_lines()


def completion_text(events: list[dict]) -> str:
    return "".join(c["text"] for event in events if isinstance(event, dict) for c in event.get("choices", []))


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server) -> Iterator[LiveServer]:
    settings = {
        "chat_template": "transcript",
        "max_batch_size": 1,
    }  # one row: default work takes flex's place
    with serve(tiny_model_dir, redis_server, "admission", **settings) as live:
        yield live


# ---------------------------------------------------------------------------------------------- service_tier


def test_service_tier_is_echoed_as_served_on_every_family(server):
    with server.client() as client:
        for asked, served in (
            (None, "default"),
            ("auto", "default"),
            ("flex", "flex"),
            ("priority", "priority"),
        ):
            tier = {} if asked is None else {"service_tier": asked}
            body = {"prompt": "Once", "max_tokens": 2, **tier}
            assert client.post("/v1/completions", json=body).json()["service_tier"] == served
            chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **tier}
            assert client.post("/v1/chat/completions", json=chat).json()["service_tier"] == served
            response = client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 2, **tier})
            assert response.json()["service_tier"] == served
            session = client.post("/v1/sessions", json={"text": "A", **tier}).json()
            step = client.post(f"/v1/sessions/{session['id']}/append", json={"text": "B", **tier}).json()
            assert step["service_tier"] == served
            generated = client.post(f"/v1/sessions/{session['id']}/generate", json={"max_tokens": 2, **tier})
            assert generated.json()["service_tier"] == served
        chunks = sse_events(
            client.post("/v1/completions", json={**body, "stream": True, "service_tier": "flex"})
        )
        assert {c["service_tier"] for c in chunks if isinstance(c, dict)} == {"flex"}
        wrong = client.post("/v1/completions", json={"prompt": "x", "service_tier": "gold"})
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "service_tier"


# ---------------------------------------------------------------------------------------------- preemption


def test_a_flex_row_leaves_the_batch_for_default_work_and_comes_back_with_the_same_tokens(server):
    body = {"prompt": "The flex stream", "max_tokens": 48, "temperature": 1.0, "seed": 7, "stream": True}
    flex = {**body, "service_tier": "flex"}
    with server.client() as client:
        alone = completion_text(sse_events(client.post("/v1/completions", json=flex)))
        with slowed(server, 0.01):
            arrivals: list[float] = []
            events: list[dict] = []
            default_done: list[float] = []

            def default_work() -> None:
                with server.client() as other:
                    response = other.post(
                        "/v1/completions",
                        json={"prompt": "Default", "max_tokens": 24, "service_tier": "default"},
                    )
                    assert response.status_code == 200
                    default_done.append(time.monotonic())

            worker = None
            for line in stream_lines(client, "/v1/completions", flex):
                if not line.startswith("data: {"):
                    continue
                events.append(json.loads(line[len("data: ") :]))
                arrivals.append(time.monotonic())
                if len(arrivals) == 8:  # mid-stream, at a token boundary: default work arrives
                    worker = threading.Thread(target=default_work)
                    worker.start()
            assert worker is not None
            worker.join()
    assert completion_text(events) == alone  # its memory and its sampling went on where they were
    # It left the batch: while the default request's 24 tokens ran on the only row, no flex token came.
    paused = max(b - a for a, b in itertools.pairwise(arrivals))
    assert paused >= 20 * 0.01 and any(t > default_done[0] for t in arrivals)


# ---------------------------------------------------------------------------------------------- refusals


def test_a_request_that_cannot_start_within_the_target_is_refused_at_once_with_a_computed_retry_after(
    tiny_model_dir, redis_server
):
    settings = {"max_batch_size": 2, "ttft_target_seconds": 0.3, "tbt_target_seconds": 1.0}
    with (
        serve(tiny_model_dir, redis_server, "refusals", **settings) as live,
        slowed(live, 0.02),
        live.client() as client,
    ):
        body = {"prompt": "Long", "max_tokens": 300, "stream": True}
        streams = [client.stream("POST", "/v1/completions", json=body) for _ in range(2)]
        opened = [stream.__enter__() for stream in streams]
        try:
            for response in opened:  # both rows of the batch are taken, for about 6 s
                assert response.status_code == 200
                next(response.iter_lines())
            started = time.monotonic()
            refused = client.post("/v1/completions", json={"prompt": "Me too", "max_tokens": 5})
            took = time.monotonic() - started
            models = client.get("/v1/models")
        finally:
            for stream in streams:
                stream.__exit__(None, None, None)
        error = refused.json()["error"]
        assert refused.status_code == 429 and error["type"] == "requests", refused.text
        assert error["code"] == "first_token_target" and took < 2.0
        retry_ms = int(refused.headers["retry-after-ms"])
        # Computed from the queue: a row frees once one of the streams' ~300 tokens is done, at the measured
        # step (not a constant second).
        assert 1000 < retry_ms < 60_000 and int(refused.headers["Retry-After"]) == -(-retry_ms // 1000)
        assert models.status_code == 200  # what takes no row is not refused
        text = client.get("/metrics").text
        assert metric(text, "txl_refusals_total", **{"class": "default", "reason": "first_token_target"}) >= 1
        assert metric(text, "txl_latency_target_seconds", target="ttft") == 0.3


# ---------------------------------------------------------------------------------------------- tenants


def test_one_key_cannot_take_another_keys_slots_or_rows(tiny_model_dir, redis_server):
    settings = {
        "api_keys": "crowd-key,lone-key",
        "max_concurrent_requests": 8,  # with keys, the last one is kept for a key below its share
        "max_batch_size": 2,
        "ttft_target_seconds": 600.0,  # everything is admitted: the rows are shared by key
    }
    with serve(tiny_model_dir, redis_server, "tenants", **settings) as live, slowed(live, 0.02):
        release = threading.Event()

        def crowding() -> None:
            with (
                live.client("crowd-key") as crowd,
                crowd.stream("POST", "/v1/completions", json=body) as stream,
            ):
                assert stream.status_code == 200
                release.wait(30)

        body = {"prompt": "Crowd", "max_tokens": 200, "stream": True}
        crowds = [threading.Thread(target=crowding) for _ in range(7)]
        for thread in crowds:
            thread.start()
        slots = live.app.state.slots
        deadline = time.monotonic() + 20
        while slots.total < 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            with live.client("crowd-key") as crowd, live.client("lone-key") as lone:
                refused = crowd.get("/v1/models")
                assert refused.status_code == 429 and refused.json()["error"]["code"] == "tenant_share"
                assert lone.get("/v1/models").status_code == 200
                started = time.monotonic()
                served = lone.post("/v1/completions", json={"prompt": "Lone", "max_tokens": 3})
                took = time.monotonic() - started
            assert served.status_code == 200
            # Two rows, seven streams of the crowd: the lone key's request took a row at once (fair share) rather
            # than waiting behind the crowd's five queued streams (about 4 s each at 20 ms a step).
            assert took < 2.0
        finally:
            release.set()
            for thread in crowds:
                thread.join()


def test_a_crowd_row_leaves_the_batch_for_another_keys_lone_request_and_comes_back_with_the_same_tokens(
    tiny_model_dir, redis_server
):
    settings = {
        "api_keys": "crowd-key,lone-key",
        "max_batch_size": 2,
        "ttft_target_seconds": 600.0,  # everything is admitted: the rows are shared by key
    }
    body = {"prompt": "The crowd's stream", "max_tokens": 48, "temperature": 1.0, "seed": 7, "stream": True}
    with serve(tiny_model_dir, redis_server, "tenant-preemption", **settings) as live:
        with live.client("crowd-key") as client:
            alone = completion_text(sse_events(client.post("/v1/completions", json=body)))
        with slowed(live, 0.01), live.client("crowd-key") as first, live.client("crowd-key") as second:
            lone_done: list[float] = []

            def lone_request() -> None:
                with live.client("lone-key") as lone:
                    response = lone.post("/v1/completions", json={"prompt": "Lone", "max_tokens": 24})
                    assert response.status_code == 200
                    lone_done.append(time.monotonic())

            with first.stream("POST", "/v1/completions", json=body) as older:
                assert older.status_code == 200
                lines = older.iter_lines()
                older_events = [json.loads(next(lines)[len("data: ") :])]  # its row is in the batch
                arrivals: list[float] = []
                events: list[dict] = []
                worker = None
                for line in stream_lines(second, "/v1/completions", body):
                    if not line.startswith("data: {"):
                        continue
                    events.append(json.loads(line[len("data: ") :]))
                    arrivals.append(time.monotonic())
                    if len(arrivals) == 8:  # both rows are the crowd's: the lone key's request arrives
                        worker = threading.Thread(target=lone_request)
                        worker.start()
                assert worker is not None
                worker.join()
                older_events += [json.loads(x[len("data: ") :]) for x in lines if x.startswith("data: {")]
    # Both went on where they were: their memory and their sampling (the same seed, the same tokens).
    assert completion_text(events) == alone and completion_text(older_events) == alone
    # The crowd's younger row left at a token boundary for the lone key's (fair share: one row each), and came
    # back when a row was free: no token of it while the lone request's 24 tokens ran.
    paused = max(b - a for a, b in itertools.pairwise(arrivals))
    assert paused >= 20 * 0.01 and any(t > lone_done[0] for t in arrivals)


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_takes_no_slot(tiny_model_dir, redis_server):
    settings = {"max_concurrent_requests": 1, "body_timeout_seconds": 0.5}
    with serve(tiny_model_dir, redis_server, "bodies", **settings) as live, live.client() as client:
        release = threading.Event()

        def never_ending():
            yield b'{"text": "It was'
            release.wait(10)

        answers: list[httpx.Response] = []
        uploads = [
            threading.Thread(
                target=lambda: answers.append(
                    live.client().post(
                        "/v1/sessions", content=never_ending(), headers={"Content-Type": "application/json"}
                    )
                )
            )
            for _ in range(3)
        ]
        for upload in uploads:
            upload.start()
        time.sleep(0.2)
        assert client.get("/v1/sessions").status_code == 200  # the one slot is free: uploads hold none
        time.sleep(0.6)
        release.set()
        for upload in uploads:
            upload.join()
        assert [a.status_code for a in answers] == [408] * 3
        assert {a.json()["error"]["type"] for a in answers} == {"request_timeout"}
        assert all(a.headers["connection"] == "close" for a in answers)
