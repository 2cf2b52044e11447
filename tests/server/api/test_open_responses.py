"""Open Responses conformance: the specification's compliance checks (basic response, streaming, system prompt,
multi-turn) ported from its suite, each response and stream event validated against the specification's own
schemas (the `openresponses-types` package, generated from its OpenAPI document); and our chaining checks, which
its suite lacks. The model is scripted (tests/helpers/scripted_model.py): its replies end at the template's stop,
so responses are `completed` for real."""

from __future__ import annotations

import json

import openresponses_types as types
import pytest

from tests.helpers.live_server import client_fixture, live_server_fixture
from tests.helpers.scripted_model import make_scripted_model_dir

server = live_server_fixture("open-responses", model="scripted_model_dir", chat_template="transcript")
http = client_fixture()

STREAMING_EVENTS = {
    "response.created": types.ResponseCreatedStreamingEvent,
    "response.queued": types.ResponseQueuedStreamingEvent,
    "response.in_progress": types.ResponseInProgressStreamingEvent,
    "response.completed": types.ResponseCompletedStreamingEvent,
    "response.failed": types.ResponseFailedStreamingEvent,
    "response.incomplete": types.ResponseIncompleteStreamingEvent,
    "response.output_item.added": types.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": types.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": types.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": types.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": types.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": types.ResponseOutputTextDoneStreamingEvent,
    "error": types.ErrorStreamingEvent,
}


@pytest.fixture(scope="module")
def scripted_model_dir(tmp_path_factory):
    return make_scripted_model_dir(tmp_path_factory.mktemp("models") / "scripted")


def message(role: str, content: str) -> dict:
    return {"type": "message", "role": role, "content": content}


def create(http, body: dict) -> dict:
    reply = http.post("/v1/responses", json={"model": "scripted", **body})
    assert reply.status_code == 200, reply.text
    response = reply.json()
    types.ResponseResource.model_validate(response)  # the specification's schema, or it raises
    return response


def stream(http, body: dict) -> tuple[list[str], list[dict]]:
    """The stream's SSE lines and its events, each event's `event` name checked against its body's type."""
    with http.stream("POST", "/v1/responses", json={"model": "scripted", **body, "stream": True}) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = list(reply.iter_lines())
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: ") and line != "data: [DONE]":
            event = json.loads(line.removeprefix("data: "))
            assert name == event["type"]  # "The event field MUST match the type in the event body"
            STREAMING_EVENTS[event["type"]].model_validate(event)
            events.append(event)
    return lines, events


def completed_with_output(response: dict) -> None:
    assert response["status"] == "completed", response
    assert response["output"] and any(item["type"] == "message" for item in response["output"])
    assert response["output"][0]["status"] == "completed" and response["incomplete_details"] is None


# ---------------------------------------------------------------------------------------------- the suite's checks


def test_basic_response(http):
    response = create(http, {"input": [message("user", "Say hello in exactly 3 words.")]})
    completed_with_output(response)
    assert response["output"][0]["content"][0]["text"] == "Hi!"  # the script, cut at the template's stop


def test_streaming_response(http):
    lines, events = stream(http, {"input": [message("user", "Count from 1 to 5.")]})
    assert [line for line in lines if line][-1] == "data: [DONE]"  # "The terminal event MUST be [DONE]"
    kinds = [e["type"] for e in events]
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
        "response.completed",
    ]
    added = events[2]["item"]
    assert added["status"] == "in_progress" and added["content"] == [] and added["role"] == "assistant"
    completed_with_output(events[-1]["response"])
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_system_prompt(http):
    response = create(
        http,
        {
            "input": [
                message("system", "You are a pirate. Always respond in pirate speak."),
                message("user", "Say hello."),
            ]
        },
    )
    completed_with_output(response)


def test_multi_turn(http):
    response = create(
        http,
        {
            "input": [
                message("user", "My name is Alice."),
                message("assistant", "Hello Alice! Nice to meet you. How can I help you today?"),
                message("user", "What is my name?"),
            ]
        },
    )
    completed_with_output(response)


# ---------------------------------------------------------------------------------------------- ours: chaining


def test_a_chained_turn_is_a_valid_response_that_feeds_only_its_input(http):
    first = create(http, {"input": [message("user", "Hello.")]})
    second = create(http, {"input": [message("user", "Again.")], "previous_response_id": first["id"]})
    completed_with_output(second)
    assert second["previous_response_id"] == first["id"]
    # The first reply ended at the template's stop: "\nUser:" is in memory already, only " Again.\nAssistant:" is fed.
    fed = second["usage"]["input_tokens"] - second["usage"]["input_tokens_details"]["cached_tokens"]
    assert fed == len(" Again.\nAssistant:")


def test_a_chained_stream_is_valid_and_ends_with_done(http):
    first = create(http, {"input": [message("user", "Hello.")]})
    lines, events = stream(http, {"input": [message("user", "More.")], "previous_response_id": first["id"]})
    assert [line for line in lines if line][-1] == "data: [DONE]"
    completed_with_output(events[-1]["response"])
    assert events[-1]["response"]["previous_response_id"] == first["id"]


def test_logprobs_are_included_as_specified(http):
    response = create(
        http,
        {"input": [message("user", "Hi.")], "include": ["message.output_text.logprobs"], "top_logprobs": 2},
    )
    part = response["output"][0]["content"][0]
    assert len(part["logprobs"]) == len(" Hi!\nUser:")  # every token of the reply, the stop's included
    first = part["logprobs"][0]
    assert first["token"] == " " and first["logprob"] > -1e-3 and len(first["top_logprobs"]) == 2
    assert first["top_logprobs"][0]["token"] == " " and first["bytes"] == [32]
    _, events = stream(http, {"input": [message("user", "Hi.")], "include": ["message.output_text.logprobs"]})
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert all(len(d["logprobs"]) == 1 for d in deltas)


def test_an_include_this_server_has_nothing_for_is_refused(http):
    reply = http.post("/v1/responses", json={"input": "x", "include": ["reasoning.encrypted_content"]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "include.0"


def test_truncation_disabled_fails_rather_than_let_the_window_slide(http):
    long = "a long message " * 4  # 60 bytes: more than the memory's window of 32 positions
    refused = http.post(
        "/v1/responses", json={"input": long, "truncation": "disabled", "max_output_tokens": 4}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    short = create(http, {"input": "Hi", "truncation": "disabled", "max_output_tokens": 4})
    assert short["truncation"] == "disabled"
    slid = create(http, {"input": long, "max_output_tokens": 4})  # auto, the default here: the window slides
    assert slid["truncation"] == "auto" and slid["status"] == "incomplete"
    assert slid["incomplete_details"] == {"reason": "max_output_tokens"}
    assert slid["output"][0]["status"] == "incomplete"
