"""OpenAI's Responses API on a real server and Redis, driven by the official `openai` client: create, chain with
previous_response_id (only the new input is fed; equal to one request carrying the whole text), branch from an
older response, stream, retrieve, delete, input items, errors in OpenAI's shape, tenants, store=false, messages."""

from __future__ import annotations

import json
import threading

import pytest
from txl.sampling import SamplingParams
from txl_server.api.responses.protocol import ResponseCreateRequest
from txl_server.api.responses.turn_input import turn_text
from txl_server.api.shared.chat_template import ChatTemplate
from txl_server.errors import Conflict
from txl_server.sessions.store.responses import ResponseRecord, parse_response_id, response_id
from txl_server.settings import TRANSCRIPT_TEMPLATE, Persistence

from tests.helpers.live_server import client_fixture, live_server_fixture, serve
from tests.helpers.runtimes import OWNER, generate, running
from tests.helpers.tiny_models import make_text_model_dir

openai = pytest.importorskip("openai")

KEY_A, KEY_B = "key-responses-a", "key-responses-b"
KEEP = 4
GREEDY = {"temperature": 0, "max_output_tokens": 12}


@pytest.fixture(scope="module")
def text_model_dir(tmp_path_factory):
    return make_text_model_dir(tmp_path_factory.mktemp("models") / "tiny-byte")


server = live_server_fixture(
    "responses",
    model="text_model_dir",
    api_keys=f"{KEY_A},{KEY_B}",
    chat_template="transcript",
    persistence=Persistence.ALWAYS,
    keep_versions=KEEP,
)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_A, max_retries=0)


http = client_fixture(KEY_A)


def _create(client, text: str, **kwargs):
    return client.responses.create(model="tiny-byte", input=text, **{**GREEDY, **kwargs})


def _session_of(response) -> str:
    parsed = parse_response_id(response.id)
    assert parsed is not None
    return parsed[0]


# ---------------------------------------------------------------------------------------------- create and chain


def test_create_answers_a_response_object_the_client_reads(client, http):
    response = _create(client, "The lighthouse keeper")
    assert response.object == "response" and response.model == "tiny-byte"
    assert response.output_text and response.output[0].content[0].type == "output_text"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    usage = response.usage
    assert usage.input_tokens == len("The lighthouse keeper") and usage.output_tokens == 12
    assert usage.input_tokens_details.cached_tokens == 0 and usage.total_tokens == usage.input_tokens + 12
    session = http.get(f"/v1/sessions/{_session_of(response)}").json()
    assert response.id == response_id(session["id"], session["version"])  # the session and its version after


def test_a_chain_feeds_only_the_new_input_and_equals_one_request_with_the_whole_text(client, http):
    first = _create(client, "It was a dark and stormy night")
    session = http.get(f"/v1/sessions/{_session_of(first)}").json()
    second = _create(client, "; the rain fell", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert _session_of(second) == _session_of(first)  # the newest version: continued, not forked
    details = second.usage.input_tokens_details
    assert details.cached_tokens == session["mem_tokens"] > 0  # the positions served from memory
    assert second.usage.input_tokens == len("; the rain fell") + details.cached_tokens
    assert details.cache_write_tokens == len("; the rain fell")
    whole = _create(client, "It was a dark and stormy night" + first.output_text + "; the rain fell")
    assert second.output_text == whole.output_text


def test_a_stored_turns_record_is_written_by_its_commit_in_the_same_step(server, client, monkeypatch):
    """No second round trip after the commit: a turn's record is stored by the script that commits its version
    (so a response exists exactly when its turn committed)."""
    turns = server.app.state.runtime.responses.turns

    async def no_separate_save(record):
        raise AssertionError(f"{record.id} was saved after its commit")

    monkeypatch.setattr(turns.store, "save", no_separate_save)
    first = _create(client, "Lanterns in the fog")
    second = _create(client, ", gulls", previous_response_id=first.id)
    streamed = [
        e
        for e in client.responses.create(
            model="tiny-byte", input=" and", previous_response_id=second.id, stream=True, **GREEDY
        )
    ]
    third = streamed[-1].response
    for answered in (first, second, third):
        assert client.responses.retrieve(answered.id).model_dump() == answered.model_dump()
    assert _session_of(third) == _session_of(first)


def test_a_first_turn_reads_its_input_through_the_prefix_cache(client):
    transcript = "The harbour master kept a log of every ship that came in on the morning tide. " * 2
    first = _create(client, transcript, store=False)
    again = _create(client, transcript + "Then", store=False)  # the transcript resent, grown: a cache hit
    assert first.usage.input_tokens_details.cached_tokens == 0
    cached = again.usage.input_tokens_details.cached_tokens
    assert 0 < cached <= len(transcript) and again.usage.input_tokens == len(transcript + "Then")
    whole = _create(client, transcript + "Then", store=False)
    assert whole.output_text == again.output_text  # a hit gives what a miss gives


def test_two_turns_chained_to_one_response_branch_and_give_equal_results(client):
    root = _create(client, "Once upon a time")
    one = _create(client, " there was", previous_response_id=root.id)
    two = _create(client, " there was", previous_response_id=root.id)
    assert one.output_text == two.output_text
    assert _session_of(one) == _session_of(root) and _session_of(two) != _session_of(root)  # two is a fork
    # Either branch continues on its own.
    assert _create(client, " and", previous_response_id=two.id).output_text == (
        _create(client, " and", previous_response_id=one.id).output_text
    )


def test_a_turn_that_branches_never_fetches_the_state_its_session_moved_on_to(server, client, monkeypatch):
    """A chained turn finds its session moved on under the step's lease, before that newer state is brought to
    the device (it may have to be read back from the block store): it branches at once."""
    root = _create(client, "In the beginning")
    _create(client, " was", previous_response_id=root.id)  # the session moves on
    placement = server.app.state.runtime.service.placement
    fetched, fetch = [], placement.fetch

    async def counted(meta):
        fetched.append(meta.id)
        return await fetch(meta)

    monkeypatch.setattr(placement, "fetch", counted)
    branch = _create(client, " was", previous_response_id=root.id)
    assert _session_of(branch) != _session_of(root)
    assert _session_of(root) not in fetched


def test_a_turn_chained_to_a_response_this_server_stored_reads_nothing_before_its_step(
    server, client, monkeypatch
):
    """The previous response is known to the process that stored it; Redis's copy is checked by the step's lease
    script instead of read first (one round trip less)."""
    turns = server.app.state.runtime.responses.turns
    root = _create(client, "Far over the hills")

    async def no_read(owner, response_id):
        raise AssertionError(f"{response_id} was read")

    monkeypatch.setattr(turns.store, "find", no_read)
    second = _create(client, " and away", previous_response_id=root.id)
    assert _session_of(second) == _session_of(root) and second.usage.input_tokens_details.cached_tokens > 0


def _drop_in_redis(server, response) -> None:
    """Deletes the response's record as another replica's DELETE would: this process still knows it."""
    store = server.app.state.runtime.service.store
    server.run(store.redis.hdel(store.keys.responses(_session_of(response)), response.id))


@pytest.mark.parametrize("moved_on", [False, True], ids=["continued", "branched"])
def test_a_response_deleted_elsewhere_cannot_be_continued_though_this_server_knows_it(
    server, client, http, moved_on
):
    root = _create(client, "The clockmaker's shop")
    if moved_on:
        _create(client, " was", previous_response_id=root.id)
    session = http.get(f"/v1/sessions/{_session_of(root)}").json()
    _drop_in_redis(server, root)
    with pytest.raises(openai.BadRequestError) as caught:
        _create(client, " was", previous_response_id=root.id)
    assert caught.value.body["code"] == "previous_response_not_found"
    assert http.get(f"/v1/sessions/{_session_of(root)}").json()["version"] == session["version"]  # untouched


def test_concurrent_turns_chained_to_one_response_give_equal_results(server, client):
    root = _create(client, "The harbour at dawn")
    results = []

    def chain():
        own = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_A, max_retries=0)
        results.append(own.responses.create(input=" was quiet", previous_response_id=root.id, **GREEDY))

    threads = [threading.Thread(target=chain) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and len({r.output_text for r in results}) == 1
    assert len({r.id for r in results}) == 3
    assert [_session_of(r) for r in results].count(_session_of(root)) == 1  # one continued it, two branched


def test_a_response_whose_version_is_no_longer_kept_cannot_be_continued(client):
    root = _create(client, "a")
    last = root
    for _ in range(KEEP):
        last = _create(client, " b", previous_response_id=last.id)
    with pytest.raises(openai.BadRequestError) as caught:
        _create(client, " c", previous_response_id=root.id)
    assert caught.value.body["code"] == "previous_response_not_found"
    assert _create(client, " c", previous_response_id=last.id).output_text


# ---------------------------------------------------------------------------------------------- stream


def test_stream_sends_the_documented_events_whose_deltas_join_to_the_text(client):
    expected = _create(client, "In the beginning", store=False)
    with client.responses.create(input="In the beginning", stream=True, **GREEDY) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # at max_output_tokens, as OpenAI's
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == expected.output_text == events[-4].text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == 12
    assert events[0].response.id == final.id and events[0].response.status == "in_progress"
    assert client.responses.retrieve(final.id).output_text == text  # stored before the stream ended


def test_each_streamed_event_names_its_type_and_the_stream_ends_with_done(http):
    body = {"input": "Hi", "stream": True, "max_output_tokens": 3}
    with http.stream("POST", "/v1/responses", json=body) as reply:
        lines = [line for line in reply.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"  # Open Responses: the terminal event is the literal [DONE]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines[:-1] if line.startswith("data: ")]
    assert names == [d["type"] for d in data] and names[0] == "response.created"


def test_an_error_mid_stream_is_an_error_event_then_response_failed_then_done(server, http):
    body = {"input": "Long", "stream": True, "temperature": 0, "max_output_tokens": 400}
    with http.stream("POST", "/v1/responses", json=body) as reply:
        lines = []
        for line in reply.iter_lines():
            lines.append(line)
            if line.startswith("data: {") and json.loads(line[6:])["type"] == "response.created":
                # The session expires while the turn runs: its commit finds nothing to commit to.
                store = server.app.state.runtime.service.store
                session = parse_response_id(json.loads(line[6:])["response"]["id"])[0]
                server.run(store.redis.delete(store.keys.session(session)))
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
    # Open Responses: an error mid-stream is followed by response.failed; its `error` object is the spec's, its
    # top-level code, message and param OpenAI's.
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "not_found" == events[-2]["error"]["code"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "not_found"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_the_openai_client_raises_the_error_of_a_stream_that_failed(server, client):
    with (
        pytest.raises(openai.APIError) as caught,
        client.responses.create(input="Long", stream=True, temperature=0, max_output_tokens=400) as stream,
    ):
        for event in stream:
            if event.type == "response.created":
                store = server.app.state.runtime.service.store
                server.run(store.redis.delete(store.keys.session(_session_of(event.response))))
    assert caught.value.body["code"] == "not_found"


# ---------------------------------------------------------------------------------------------- stored responses


def test_retrieve_delete_and_input_items(client):
    response = _create(client, "Hello there", instructions="Say hi. ", metadata={"user": "ada"})
    got = client.responses.retrieve(response.id)
    assert got.model_dump() == response.model_dump()
    assert got.instructions == "Say hi. " and got.metadata == {"user": "ada"}
    items = client.responses.input_items.list(response.id)
    assert [(i.role, i.content[0].text) for i in items.data] == [("user", "Hello there")]
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as caught:
        _create(client, "more", previous_response_id=response.id)
    assert caught.value.body["code"] == "previous_response_not_found"


def test_an_unknown_previous_response_is_openais_400(http):
    for unknown in ("resp_nothing", response_id("x" * 32, 3), "not-an-id"):
        reply = http.post("/v1/responses", json={"input": "x", "previous_response_id": unknown})
        assert reply.status_code == 400
        assert reply.json() == {
            "error": {
                "type": "invalid_request_error",
                "code": "previous_response_not_found",
                "param": "previous_response_id",
                "message": f"Previous response with id {unknown!r} not found.",
            }
        }
    assert http.get("/v1/responses/resp_nothing").status_code == 404


def test_tenants_are_kept_apart(server, client):
    response = _create(client, "private words")
    other = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_B, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.input_items.list(response.id)
    with pytest.raises(openai.BadRequestError) as caught:
        other.responses.create(input="x", previous_response_id=response.id, **GREEDY)
    assert caught.value.body["code"] == "previous_response_not_found"
    assert client.responses.retrieve(response.id).id == response.id


def test_every_responses_route_needs_a_key(server):
    with server.client() as anonymous:
        for method, path in [
            ("POST", "/v1/responses"),
            ("GET", "/v1/responses/resp_x.1"),
            ("DELETE", "/v1/responses/resp_x.1"),
            ("GET", "/v1/responses/resp_x.1/input_items"),
        ]:
            reply = anonymous.request(method, path, json={"input": "x"} if method == "POST" else None)
            assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key", path


def test_store_false_answers_and_keeps_nothing(client, http):
    root = _create(client, "Kept")
    before = len(http.get("/v1/sessions").json()["data"])
    unstored = _create(client, "Not kept", store=False)
    chained = _create(client, " either", previous_response_id=root.id, store=False)
    assert (
        unstored.output_text and chained.output_text and chained.usage.input_tokens_details.cached_tokens > 0
    )
    assert chained.usage.input_tokens_details.cache_write_tokens == 0
    assert len(http.get("/v1/sessions").json()["data"]) == before  # their sessions went with them
    for response in (unstored, chained):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response.id)
        with pytest.raises(openai.BadRequestError):
            _create(client, "more", previous_response_id=response.id)
    # The session it chained to did not move: continuing it gives what it gave.
    assert _session_of(_create(client, " either", previous_response_id=root.id)) == _session_of(root)
    assert _create(client, " either", previous_response_id=root.id).output_text == chained.output_text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input.0.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content",
        ),
        ({"input": []}, "input"),
    ],
)
def test_limits_are_refused_naming_the_field(http, body, param):
    reply = http.post("/v1/responses", json={"input": "x", **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


# ---------------------------------------------------------------------------------------------- messages


def test_messages_are_written_out_with_the_chat_template(client, http):
    template = ChatTemplate(TRANSCRIPT_TEMPLATE)
    messages = [{"role": "user", "content": "Hi"}]
    first = client.responses.create(input=messages, instructions="Be brief.", **GREEDY)
    prompt = "System: Be brief.\nUser: Hi\nAssistant:"
    completion = http.post(
        "/v1/completions",
        json={"prompt": prompt, "max_tokens": 12, "temperature": 0, "stop": [template.stop()]},
    ).json()["choices"][0]
    assert first.output_text == completion["text"].lstrip()
    assert [
        (i.role, i.content[0].text) for i in client.responses.input_items.list(first.id, order="asc").data
    ] == [("user", "Hi")]
    second = client.responses.create(
        input=[{"role": "user", "content": "And?"}], previous_response_id=first.id, **GREEDY
    )
    if completion["finish_reason"] == "stop":  # the model began the user's turn: it is not written again
        whole = prompt + completion["text"] + template.stop() + " And?\nAssistant:"
    else:  # its reply was cut: it is closed
        whole = prompt + completion["text"] + "\nUser: And?\nAssistant:"
    expected = http.post(
        "/v1/completions",
        json={"prompt": whole, "max_tokens": 12, "temperature": 0, "stop": [template.stop()]},
    ).json()["choices"][0]["text"]
    assert second.output_text == expected.lstrip()


def _previous(messages: bool, turn_end: bool) -> ResponseRecord:
    return ResponseRecord(response_id("s" * 32, 2), OWNER, {}, [], messages, turn_end)


@pytest.mark.parametrize(
    ("previous", "expected"),
    [
        (None, "User: Next\nAssistant:"),
        (_previous(messages=True, turn_end=True), " Next\nAssistant:"),  # "\nUser:" is in memory already
        (_previous(messages=True, turn_end=False), "\nUser: Next\nAssistant:"),  # the cut reply is closed
        (_previous(messages=False, turn_end=False), "User: Next\nAssistant:"),
    ],
)
def test_a_chained_turn_of_messages_continues_the_transcript_where_the_model_left_it(previous, expected):
    body = ResponseCreateRequest(input=[{"role": "user", "content": "Next"}])
    assert turn_text(body, ChatTemplate(TRANSCRIPT_TEMPLATE), previous)[0] == expected
    with_instructions = ResponseCreateRequest(
        input=[{"role": "user", "content": "Next"}], instructions="Terse."
    )
    text = turn_text(with_instructions, ChatTemplate(TRANSCRIPT_TEMPLATE), _previous(True, True))[0]
    assert text == " \nSystem: Terse.\nUser: Next\nAssistant:"  # the user's begun turn closed, empty


def test_string_input_follows_its_instructions_verbatim():
    body = ResponseCreateRequest(input="Chapter 1", instructions="A novel. ")
    assert turn_text(body, None, None) == ("A novel. Chapter 1", None)


def test_messages_without_a_chat_template_are_refused_naming_the_setting(tiny_model_dir, redis_server):
    for live in serve(tiny_model_dir, redis_server.url, "responses-plain"):
        with live.client() as http:
            reply = http.post("/v1/responses", json={"input": [{"role": "user", "content": "Hi"}]})
            assert reply.status_code == 400 and "TXL_CHAT_TEMPLATE" in reply.json()["error"]["message"]
            assert http.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 3}).status_code == 200


# ---------------------------------------------------------------------------------------------- the service


async def test_generate_with_an_expected_version_refuses_a_session_that_moved_on(make_settings):
    async with running(make_settings()) as rt:
        service = rt.service
        meta = await service.create(OWNER, text="Version one.")
        await service.append(OWNER, meta.id, " Two.")
        with pytest.raises(Conflict) as caught:
            await generate(service, meta.id, expected_version=1)
        assert caught.value.code == "version_moved"
        assert (await service.get(OWNER, meta.id)).version == 2  # nothing committed
        _, outcome = await generate(
            service, meta.id, expected_version=2, sampling=SamplingParams(temperature=0)
        )
        assert outcome.session.version == 3
