"""The synchronous SDK against a real server: typed results, streaming, every typed error, safe retries."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from txl_client import (
    AppendResult,
    Client,
    Conflict,
    GenerateResult,
    Gone,
    InvalidRequest,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    ScoreResult,
    Session,
    TokenEvent,
    TxlConnectionError,
    TxlError,
    TxlTimeoutError,
    Unauthorized,
    Unavailable,
)
from txl_server.sessions.redis_server import EmbeddedRedis, free_port
from txl_server.settings import Persistence

from tests.helpers.gate import Gate
from tests.helpers.live_server import LiveServer

from .conftest import API_KEY, server_settings
from .proxy import DroppingProxy


@pytest.fixture
def client(server):
    with Client(server.url, API_KEY) as client:
        yield client


# ---------------------------------------------------------------------------------------------- results


def test_session_lifecycle_returns_typed_results(client):
    session = client.create_session(text="Hello", metadata={"user": "ada"}, ttl_seconds=600, mem_len=16)
    assert isinstance(session, Session)
    assert (session.tokens, session.version, session.mem_len, session.metadata) == (5, 1, 16, {"user": "ada"})
    assert client.get_session(session.id) == session
    assert session.id in [s.id for s in client.list_sessions()]

    appended = client.append(session.id, " world")
    assert isinstance(appended, AppendResult)
    assert appended.tokens == 6 and appended.logprob < 0 and appended.session.version == 2

    fork = client.fork_session(session.id, metadata={"branch": 1})
    assert fork.id != session.id and fork.tokens == 11 and fork.metadata == {"branch": 1}
    client.delete_session(session.id)
    with pytest.raises(NotFound) as missing:
        client.get_session(session.id)
    assert (missing.value.status, missing.value.type) == (404, "not_found")
    assert client.get_session(fork.id).tokens == 11

    assert [m.id for m in client.models()] == ["tiny-byte"]
    assert client.health().status == "ok"


def test_streamed_tokens_join_to_the_non_streamed_text_at_temperature_zero(client):
    base = client.create_session(text="The whale")
    one, two = client.fork_session(base.id), client.fork_session(base.id)
    plain = client.generate(one.id, " is", max_tokens=24, temperature=0)
    assert isinstance(plain, GenerateResult) and plain.finish_reason == "length"
    with client.generate(two.id, " is", max_tokens=24, temperature=0, stream=True) as stream:
        tokens = list(stream)
    assert len(tokens) == 24 and all(isinstance(t, TokenEvent) and t.logprob <= 0 for t in tokens)
    assert "".join(t.text for t in tokens) == stream.text == stream.result.text == plain.text
    assert stream.result.session.version == plain.session.version == 2
    assert stream.result.usage == plain.usage and stream.result.usage.completion_tokens == 24


def test_seeded_sampling_and_stop_strings(client):
    base = client.create_session(text="aaaa")
    sampled = [
        client.generate(
            client.fork_session(base.id).id, max_tokens=12, temperature=0.9, top_k=40, top_p=0.9, seed=7
        )
        for _ in range(2)
    ]
    assert sampled[0].text == sampled[1].text
    greedy = client.generate(client.fork_session(base.id).id, max_tokens=30, temperature=0).text
    stop = greedy[3:5]
    stopped = client.generate(base.id, max_tokens=30, temperature=0, stop=[stop])
    assert stopped.finish_reason == "stop" and stopped.text == greedy[: greedy.find(stop)]


def test_closing_a_stream_early_commits_nothing(client):
    session = client.create_session(text="It was a dark and stormy night")
    with client.generate(session.id, max_tokens=250, stream=True) as stream:
        for i, _ in enumerate(stream):
            if i == 2:
                break
    assert stream.result is None
    deadline = time.monotonic() + 10
    while True:  # the server releases the session once it notices the client left
        try:
            after = client.append(session.id, ".")
            break
        except Conflict:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert after.session.version == session.version + 1
    assert after.session.tokens == session.tokens + 1


def test_score_reports_progress_and_matches_the_plain_result(client):
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 5
    plain = client.score(text, token_logprobs=True)
    assert isinstance(plain, ScoreResult) and plain.tokens == len(text)
    assert len(plain.token_texts) == len(plain.token_logprobs) == len(text)
    assert plain.token_surprisals[0] == pytest.approx(-plain.token_logprobs[0] / 0.6931471805599453)
    calls = []
    streamed = client.score(text, on_progress=lambda done, total: calls.append((done, total)))
    assert streamed.logprob == pytest.approx(plain.logprob, rel=1e-6)
    assert streamed.perplexity == pytest.approx(plain.perplexity, rel=1e-6)
    assert calls and calls[-1] == (len(text), len(text))
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_url_and_key_come_from_the_environment_when_the_client_is_made(server, monkeypatch):
    monkeypatch.setenv("TXL_URL", server.url)
    monkeypatch.setenv("TXL_API_KEY", API_KEY)
    with Client() as from_env:
        assert from_env.url == server.url and from_env.list_sessions() is not None
    monkeypatch.setenv("TXL_API_KEY", "wrong")
    with Client() as wrong, pytest.raises(Unauthorized):
        wrong.list_sessions()
    with Client(api_key=API_KEY) as argument_wins:
        argument_wins.list_sessions()


# ---------------------------------------------------------------------------------------------- errors


def test_wrong_or_missing_key_is_unauthorized(server):
    for key in ("wrong-key", None):
        with Client(server.url, key) as client, pytest.raises(Unauthorized) as caught:
            client.create_session()
        assert (caught.value.status, caught.value.type) == (401, "unauthorized")
        assert "API key" in caught.value.message


def test_invalid_input_is_invalid_request_with_its_param(client):
    session = client.create_session(text="abc")
    with pytest.raises(InvalidRequest) as validated:  # rejected by the schema: 422
        client.generate(session.id, top_p=0)
    assert (validated.value.status, validated.value.param) == (422, "top_p")
    with pytest.raises(InvalidRequest) as checked:  # rejected by the route: 400
        client.generate(session.id, stop=["a", "b", "c"])
    assert (checked.value.status, checked.value.param) == (400, "stop")
    assert isinstance(checked.value, TxlError) and "stop" in str(checked.value)
    assert client.get_session(session.id).version == session.version


def test_too_large_input_is_payload_too_large(client):
    session = client.create_session(text="abc")
    with pytest.raises(PayloadTooLarge) as long_text:
        client.append(session.id, "x" * 9000)  # over max_text_chars
    assert (long_text.value.status, long_text.value.param) == (413, "text")
    with pytest.raises(PayloadTooLarge):
        client.score("y" * 70_000)  # over max_body_bytes


def test_concurrent_appends_conflict(server, client):
    session = client.create_session(text="race")
    outcomes: list[object] = []

    def append():
        with Client(server.url, API_KEY) as own:
            try:
                outcomes.append(own.append(session.id, "z" * 2000))
            except TxlError as exc:
                outcomes.append(exc)

    threads = [threading.Thread(target=append) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conflicts = [o for o in outcomes if isinstance(o, Conflict)]
    successes = [o for o in outcomes if isinstance(o, AppendResult)]
    assert conflicts and successes and len(conflicts) + len(successes) == 4, outcomes
    assert all(c.status == 409 and c.type == "conflict" for c in conflicts)
    assert client.get_session(session.id).version == session.version + len(successes)


def test_an_error_event_mid_stream_raises_its_typed_error(server, client, monkeypatch):
    from txl_server.engine.jobs import TokenEvent as ServerToken
    from txl_server.errors import Gone as ServerGone

    async def fails_after_one_token(*args, **kwargs):
        yield ServerToken(id=65, text="A", logprob=-1.0)
        raise ServerGone("the session's memory was dropped")

    monkeypatch.setattr(server.app.state.runtime.service, "generate", fails_after_one_token)
    session = client.create_session(text="abc")
    received = []
    with pytest.raises(Gone) as caught, client.generate(session.id, max_tokens=5, stream=True) as stream:
        received.extend(stream)
    assert [t.text for t in received] == ["A"]
    assert (caught.value.status, caught.value.type) == (410, "gone") and "dropped" in caught.value.message


@pytest.fixture(scope="module")
def fragile(tiny_model_dir, redis_server):
    """No persistence and room for one session's memory (410 gone); one request at a time (429)."""
    settings = server_settings(
        tiny_model_dir, redis_server.url, persistence=Persistence.NONE, device_memory_bytes=40_000,
        host_memory_bytes=1, max_concurrent_requests=1,
    )  # fmt: skip
    with LiveServer(settings) as live:
        yield live


def test_dropped_memory_is_gone(fragile):
    with Client(fragile.url) as client:
        # Texts longer than mem_len: each session at rest holds a full memory, and two do not fit.
        first = client.create_session(text="one " * 10)
        client.create_session(text="two " * 10)  # takes the only room: the first session's memory is dropped
        with pytest.raises(Gone) as caught:
            client.append(first.id, "x")
        assert (caught.value.status, caught.value.type) == (410, "gone")


def hold_the_only_slot(server: LiveServer, release_after: float) -> threading.Thread:
    """Occupies the server's one request slot with a generation stream held open, and lets go after
    `release_after` seconds. (A body still arriving holds no slot: the slot is taken once the body is read.) The
    server's steps take 20 ms meanwhile, so that the stream outlasts the hold whatever the CPU's speed."""
    with httpx.Client(base_url=server.url) as probe:  # an earlier holder has gone
        while (made := probe.post("/v1/sessions", json={"text": "held"})).status_code == 429:
            time.sleep(0.02)
    runner = server.app.state.runtime.worker.runner
    run = runner.run

    def slowly(decode, chunks, **kwargs):
        time.sleep(0.02)
        return run(decode, chunks, **kwargs)

    runner.run = slowly
    holder = httpx.Client(base_url=server.url)
    body = {"max_tokens": 4000, "stream": True}
    stream = holder.stream("POST", f"/v1/sessions/{made.json()['id']}/generate", json=body)
    assert stream.__enter__().status_code == 200  # its first token came: it holds the slot until it ends

    def release():
        time.sleep(release_after)
        stream.__exit__(None, None, None)
        holder.close()
        runner.run = run

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


def test_overloaded_carries_retry_after_and_is_retried_only_when_asked(fragile):
    with Client(fragile.url) as client:
        holder = hold_the_only_slot(fragile, release_after=0.1)
        with pytest.raises(Overloaded) as caught:
            client.list_sessions()
        assert (caught.value.status, caught.value.type, caught.value.retry_after) == (429, "overloaded", 1.0)
        holder.join()

        holder = hold_the_only_slot(fragile, release_after=0.3)
        started = time.monotonic()
        sessions = client.with_options(
            retry_overloaded=True
        ).list_sessions()  # waits Retry-After: 1, then works
        assert isinstance(sessions, list) and time.monotonic() - started >= 0.9
        holder.join()


def test_redis_down_is_unavailable(tiny_model_dir, tmp_path):
    redis = EmbeddedRedis(tmp_path / "redis")
    redis.start()
    try:
        with LiveServer(server_settings(tiny_model_dir, redis.url)) as live, Client(live.url) as client:
            session = client.create_session(text="before")
            redis.kill()
            with pytest.raises(Unavailable) as caught:
                client.append(session.id, "x")
            assert (caught.value.status, caught.value.type) == (503, "unavailable")
    finally:
        redis.stop()


def test_refused_connections_are_connection_errors():
    with (
        Client(f"http://127.0.0.1:{free_port()}", max_retries=1) as client,
        pytest.raises(TxlConnectionError) as caught,
    ):
        client.list_sessions()
    assert isinstance(caught.value, ConnectionError) and caught.value.sent is False
    assert "cannot reach" in str(caught.value)


# ---------------------------------------------------------------------------------------------- retries


def test_a_lost_response_is_retried_with_the_same_key_and_steps_once(server):
    with DroppingProxy(server.port) as proxy, Client(proxy.url, API_KEY) as client:
        session = client.create_session(text="once")

        proxy.drop("/append")
        appended = client.append(session.id, " more")
        sent = proxy.requests_to("/append")
        assert [s.dropped for s in sent] == [True, False]  # the first answer was lost, the retry got one
        keys = {s.headers["idempotency-key"] for s in sent}
        assert len(keys) == 1 and keys.pop().startswith("txl-")
        assert appended.session.version == session.version + 1 == client.get_session(session.id).version

        proxy.drop("/generate")
        generated = client.generate(session.id, max_tokens=6, temperature=0.9, seed=3)
        assert generated.session.version == session.version + 2 == client.get_session(session.id).version

        proxy.drop("/generate")
        with client.generate(session.id, max_tokens=6, stream=True) as stream:
            streamed = list(stream)
        assert "".join(t.text for t in streamed) == stream.result.text
        assert stream.result.session.version == session.version + 3 == client.get_session(session.id).version

        before = len(client.list_sessions())
        proxy.drop("/fork")
        fork = client.fork_session(session.id)
        assert len(client.list_sessions()) == before + 1 and client.get_session(fork.id).tokens == fork.tokens

        # A new call gets a new key (it is a new step).
        client.append(session.id, "!")
        assert len({s.headers["idempotency-key"] for s in proxy.requests_to("/append")}) == 2


def test_without_retries_the_lost_step_still_happened_once_and_its_key_recovers_it(server):
    with DroppingProxy(server.port) as proxy, Client(proxy.url, API_KEY, max_retries=0) as client:
        session = client.create_session(text="once")
        proxy.drop("/append")
        with pytest.raises(TxlConnectionError) as lost:
            client.append(session.id, " more")
        assert lost.value.sent is True
        assert client.get_session(session.id).version == session.version + 1  # the server did apply it
        key = proxy.requests_to("/append")[0].headers["idempotency-key"]
        replayed = client.append(session.id, " more", idempotency_key=key)
        assert replayed.session.version == session.version + 1 == client.get_session(session.id).version


def test_create_and_delete_are_retried_with_their_key_after_a_lost_response(server):
    with DroppingProxy(server.port) as proxy, Client(proxy.url, API_KEY) as client:
        before = {s.id for s in client.list_sessions()}
        proxy.drop("/v1/sessions")
        session = client.create_session(text="once")  # the retry returns the session the first attempt made
        sent = [s for s in proxy.requests_to("/v1/sessions") if s.method == "POST"]
        assert [s.dropped for s in sent] == [True, False]
        assert sent[0].headers["idempotency-key"] == sent[1].headers["idempotency-key"]
        assert {s.id for s in client.list_sessions()} == before | {session.id}

        proxy.drop(f"/v1/sessions/{session.id}")
        client.delete_session(session.id)  # the retry gets the 204 again, not a 404
        deletes = [s for s in proxy.requests_to(f"/v1/sessions/{session.id}") if s.method == "DELETE"]
        assert [s.dropped for s in deletes] == [True, False]
        with pytest.raises(NotFound):
            client.get_session(session.id)


def test_a_timeout_is_raised_as_such_at_once_never_retried_into_a_conflict(server):
    session = Client(server.url, API_KEY).create_session(text="slow")
    runner = server.app.state.runtime.service.worker.runner  # each call: one forward of the engine
    with DroppingProxy(server.port) as proxy, Client(proxy.url, API_KEY, timeout=0.5) as client:
        with Gate(runner, "run"), pytest.raises(TxlTimeoutError) as caught:
            client.append(session.id, " more")
        assert str(caught.value) == f"timed out: no answer from {proxy.url} within 0.5 s"
        assert len(proxy.requests_to("/append")) == 1  # a slow server is not a gone one: no retry


def test_a_conflict_with_our_own_lost_attempt_is_reported_as_the_loss(server):
    """The first attempt's connection is lost while the server still works on it: the retries find its key in
    progress (409). When they give up, the error is the lost connection, not a conflict with ourselves."""
    with Client(server.url, API_KEY) as direct:
        session = direct.create_session(text="mine")
    runner = server.app.state.runtime.service.worker.runner  # each call: one forward of the engine
    with DroppingProxy(server.port) as proxy, Client(proxy.url, API_KEY, max_retries=2) as client:
        with Gate(runner, "run"):
            proxy.cut("/append")
            with pytest.raises(TxlConnectionError) as caught:
                client.append(session.id, " more")
            assert not isinstance(caught.value, Conflict) and "lost the connection" in str(caught.value)
        sent = proxy.requests_to("/append")
        assert len(sent) == 3 and len({s.headers["idempotency-key"] for s in sent}) == 1
        # The first attempt goes on and commits once; its key then gives its result.
        deadline = time.monotonic() + 10
        while client.get_session(session.id).version == session.version and time.monotonic() < deadline:
            time.sleep(0.05)
        replayed = client.append(session.id, " more", idempotency_key=sent[0].headers["idempotency-key"])
        assert replayed.session.version == session.version + 1 == client.get_session(session.id).version


def test_generate_reports_a_long_prompts_progress_and_outlasts_the_timeout(server):
    """Feeding the prompt takes four timeouts' time; progress arrives meanwhile, so the call does not time out."""
    prompt = "It was a bright cold day in April, and the clocks were striking thirteen. " * 20
    runner = server.app.state.runtime.service.worker.runner  # each call: one forward of the engine
    seen: list[tuple[int, int]] = []
    with Client(server.url, API_KEY, timeout=1.0) as client:
        session = client.create_session()
        with Gate(runner, "run", delay=4.0 / (len(prompt) / 8)):  # a segment (8 tokens) per forward
            result = client.generate(
                session.id, prompt, max_tokens=4, temperature=0, on_progress=lambda *p: seen.append(p)
            )
    assert isinstance(result, GenerateResult) and result.usage.prompt_tokens == len(prompt)
    assert len(seen) >= 8 and seen[-1] == (len(prompt), len(prompt))
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
