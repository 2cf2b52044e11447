"""Background responses on a real server and Redis, driven by the official `openai` client: answered at once,
polled to the end (equal to the foreground response), cancelled (nothing committed), streamed again after a
sequence number; any replica sharing the Redis answers a poll, and a job whose replica stopped is found failed."""

from __future__ import annotations

import time

import pytest
from txl_server.sessions.store.responses import parse_response_id
from txl_server.settings import Persistence

from tests.helpers.live_server import LiveServer, client_fixture, live_settings

openai = pytest.importorskip("openai")

GREEDY = {"temperature": 0, "max_output_tokens": 12}
LONG = {"temperature": 0, "max_output_tokens": 4000}


@pytest.fixture(scope="module")
def prefix():
    return live_settings("background").redis_prefix


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server, prefix):
    settings = live_settings(
        "background",
        model=tiny_model_dir,
        redis_url=redis_server.url,
        redis_prefix=prefix,
        chat_template="transcript",
        persistence=Persistence.ALWAYS,
    )
    with LiveServer(settings) as live:
        yield live


http = client_fixture()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def poll(client, response_id: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        response = client.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress") or time.monotonic() > deadline:
            return response
        time.sleep(0.02)


def test_a_background_response_answers_at_once_and_equals_the_foreground_one(client):
    queued = client.responses.create(input="The lamp", background=True, **GREEDY)
    assert queued.background and queued.status in ("queued", "in_progress") and not queued.output
    done = poll(client, queued.id)
    foreground = client.responses.create(input="The lamp", store=False, **GREEDY)
    assert done.status == "incomplete" and done.id == queued.id
    assert done.output_text == foreground.output_text and done.usage.output_tokens == 12
    assert client.responses.retrieve(done.id).output_text == done.output_text
    client.responses.delete(done.id)  # its job and its stored response both go
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(done.id)


def test_a_chained_background_response_equals_the_chained_foreground_one(client):
    root = client.responses.create(input="Harbour", **GREEDY)
    background = poll(
        client,
        client.responses.create(input=" lights", previous_response_id=root.id, background=True, **GREEDY).id,
    )
    foreground = client.responses.create(input=" lights", previous_response_id=root.id, **GREEDY)
    assert background.output_text == foreground.output_text
    assert (
        background.usage.input_tokens_details.cached_tokens
        == foreground.usage.input_tokens_details.cached_tokens
    )


def test_cancel_rolls_the_step_back_and_a_cancel_after_the_commit_changes_nothing(client, http):
    conversation = client.conversations.create()
    client.responses.create(conversation=conversation.id, input="Start", **GREEDY)
    session = conversation.id.removeprefix("conv_")
    before = http.get(f"/v1/sessions/{session}").json()["version"]
    # Several times: a cancellation that lands inside a Redis call is absorbed by the client library, and the
    # job must stop all the same.
    for _ in range(4):
        running = client.responses.create(conversation=conversation.id, input=" on", background=True, **LONG)
        assert parse_response_id(running.id) == (session, before + 1)
        time.sleep(0.1)
        cancelled = client.responses.cancel(running.id)
        assert cancelled.status == "cancelled"
        assert http.get(f"/v1/sessions/{session}").json()["version"] == before  # nothing committed
        assert len(client.conversations.items.list(conversation.id).data) == 2  # the first turn's only
        assert client.responses.retrieve(running.id).status == "cancelled"
    done = poll(client, client.responses.create(input="x", background=True, **GREEDY).id)
    assert client.responses.cancel(done.id).status == done.status == "incomplete"  # committed: as it was
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(client.responses.create(input="x", **GREEDY).id)  # not a background one


def test_a_stream_resumes_after_a_sequence_number(client):
    with client.responses.create(input="Tides", background=True, stream=True, **GREEDY) as stream:
        first = []
        for event in stream:
            first.append(event)
            if event.type == "response.output_text.delta":
                break
    response_id = first[0].response.id
    assert [e.type for e in first[:2]] == ["response.created", "response.queued"]
    cut = first[-1].sequence_number
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=cut))
    assert [e.sequence_number for e in rest] == list(range(cut + 1, cut + 1 + len(rest)))
    assert rest[-1].type == "response.incomplete"
    text = "".join(e.delta for e in [*first, *rest] if e.type == "response.output_text.delta")
    assert text == rest[-1].response.output_text == poll(client, response_id).output_text


def test_any_replica_answers_a_poll_and_a_stopped_replicas_job_is_found_failed(
    tiny_model_dir, redis_server, prefix, client
):
    settings = live_settings(
        "background", model=tiny_model_dir, redis_url=redis_server.url, redis_prefix=prefix
    )
    with LiveServer(settings) as other:
        elsewhere = openai.OpenAI(base_url=other.url + "/v1", api_key="x", max_retries=0)
        done = poll(elsewhere, elsewhere.responses.create(input="Across", background=True, **GREEDY).id)
        assert client.responses.retrieve(done.id).output_text == done.output_text  # this replica reads it
        running = elsewhere.responses.create(input="Long", background=True, **LONG)
        time.sleep(0.2)
    # The replica that ran it stopped before it finished: the next to read the job finds it failed, and why.
    failed = poll(client, running.id)
    assert failed.status == "failed" and failed.error.code == "server_error"
    assert failed.error.message.startswith("interrupted: the server running this background response stopped")
    with pytest.raises(openai.APIError) as caught:  # its stream ends with the error (then response.failed)
        list(client.responses.retrieve(running.id, stream=True, starting_after=1))
    assert caught.value.body["code"] == "server_error"
