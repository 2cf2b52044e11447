"""The OpenAI-compatible routes beyond the basics in test_api.py: log-probabilities with sessions and in streams,
latency metrics for completions, and /v1/chat/completions with a chat template, driven by the official client."""

from __future__ import annotations

import pytest
from txl_server.api.shared.chat_template import ChatMessage, ChatTemplate
from txl_server.settings import TRANSCRIPT_TEMPLATE, Settings

from tests.helpers.live_server import client_fixture, live_server_fixture
from tests.helpers.sse import DONE, sse_events

KEY = "key-openai"


server = live_server_fixture("openai", api_keys=KEY, chat_template="transcript")
client = client_fixture(KEY)


@pytest.fixture
def openai_client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def sse_chunks(response) -> list[dict]:
    return [event for event in sse_events(response) if event != DONE]


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# ---------------------------------------------------------------------------------------------- log-probabilities


def test_completions_on_a_session_report_top_logprobs(client):
    session = client.post("/v1/sessions", json={"text": "Chapter 1."}).json()
    body = {"prompt": " It", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    on_session = client.post("/v1/completions", json={**body, "session_id": session["id"]}).json()
    logprobs = on_session["choices"][0]["logprobs"]
    assert len(logprobs["top_logprobs"]) == len(logprobs["tokens"]) == 6
    for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
        assert top is not None and len(top) == 2
        # greedy: the chosen token is the likeliest
        assert max(top.values()) == pytest.approx(logprob, abs=1e-5)
        assert top.get(token, logprob) == pytest.approx(logprob, abs=1e-5)
    # The same text without a session: the same alternatives.
    stateless = client.post("/v1/completions", json={**body, "prompt": "Chapter 1. It"}).json()
    expected = stateless["choices"][0]["logprobs"]["top_logprobs"]
    for got, want in zip(logprobs["top_logprobs"], expected, strict=True):
        assert got.keys() == want.keys()
        assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-4)


@pytest.mark.parametrize("max_tokens", [0, 5])
def test_streamed_echo_with_logprobs_matches_the_json_answer(client, max_tokens):
    prompt = "It was the best of times"
    body = {"prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": max_tokens, "temperature": 0}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        chunks = [c["choices"][0] for c in sse_chunks(response)]
    echoed = chunks[0]
    assert echoed["text"] == prompt and echoed["logprobs"] is not None  # "echo + logprobs scores the prompt"
    assert "".join(echoed["logprobs"]["tokens"]) == prompt
    assert echoed["logprobs"]["text_offset"] == list(range(len(prompt)))  # one byte per token, running
    joined: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        if chunk["logprobs"] is not None:
            for field, values in chunk["logprobs"].items():
                joined[field] += values
    assert joined["tokens"] == whole["logprobs"]["tokens"]
    assert joined["text_offset"] == whole["logprobs"]["text_offset"]
    assert joined["token_logprobs"][1:] == pytest.approx(whole["logprobs"]["token_logprobs"][1:], abs=1e-5)
    assert len(joined["tokens"]) == len(prompt) + max_tokens
    assert "".join(c["text"] for c in chunks) == whole["text"]


# ---------------------------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("stream", [False, True])
def test_completions_count_in_the_latency_metrics(client, stream):
    before = client.get("/metrics").text
    body = {"prompt": ["a", "b"], "max_tokens": 5, "n": 2, "stream": stream}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200
    response.read()
    after = client.get("/metrics").text
    first = "txl_time_to_first_token_seconds_count"
    between = "txl_inter_token_latency_seconds_count"
    assert metric(after, first) == metric(before, first) + 1  # one request
    assert metric(after, between) == metric(before, between) + 4 * 4  # 4 choices, 4 gaps each


# ---------------------------------------------------------------------------------------------- chat


def test_chat_with_the_official_client_streamed_and_not(openai_client):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello there"},
    ]
    whole = openai_client.chat.completions.create(
        model="tiny-byte", messages=messages, max_tokens=12, temperature=0
    )
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("length", "stop")
    prompt = "System: You are terse.\nUser: Hello there\nAssistant:"
    assert whole.usage.prompt_tokens == len(prompt.encode())  # the byte model: one token per byte
    pieces, roles, reasons = [], [], []
    for chunk in openai_client.chat.completions.create(
        model="tiny-byte", messages=messages, max_tokens=12, temperature=0, stream=True
    ):
        for c in chunk.choices:
            roles += [c.delta.role] if c.delta.role else []
            pieces += [c.delta.content] if c.delta.content else []
            reasons += [c.finish_reason] if c.finish_reason else []
    assert roles == ["assistant"] and reasons == [choice.finish_reason]
    assert "".join(pieces) == choice.message.content


def test_chat_template_writes_a_transcript_and_stops_at_the_users_turn():
    template = ChatTemplate(TRANSCRIPT_TEMPLATE)
    messages = [
        ChatMessage(role="user", content="Hi"),
        ChatMessage(role="assistant", content="Hello."),
        ChatMessage(
            role="user", content=[{"type": "text", "text": "How "}, {"type": "text", "text": "are you?"}]
        ),
    ]
    assert template.prompt(messages) == "User: Hi\nAssistant: Hello.\nUser: How are you?\nAssistant:"
    assert template.stop() == "\nUser:"
    custom = ChatTemplate(Settings(chat_template="<|{role}|>{content}<|end|>\\n").chat_template)
    assert custom.prompt(messages[:1]) == "<|user|>Hi<|end|>\n<|assistant|>"
    assert custom.stop() == "<|end|>\n<|user|>"


def test_a_chat_template_must_hold_the_content_once():
    for bad in ("{Role}: no content", "{content}{content}", "{name}: {content}"):
        with pytest.raises(ValueError, match="chat_template"):
            Settings(chat_template=bad)


def test_chat_logprobs_are_openais_and_the_stream_joins_to_the_json(openai_client):
    messages = [{"role": "user", "content": "Hello there"}]
    options = {
        "model": "tiny-byte",
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
    }
    whole = openai_client.chat.completions.create(**options, top_logprobs=2).choices[0]
    content = whole.logprobs.content
    assert len(content) == 8  # one entry per generated token (the reply's leading whitespace included)
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2  # exactly top_logprobs, the likeliest first
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob == pytest.approx(
            entry.top_logprobs[0].logprob, abs=1e-5
        )  # greedy: the likeliest
    assert "".join(entry.token for entry in content).lstrip() == whole.message.content
    streamed = []
    for chunk in openai_client.chat.completions.create(**options, top_logprobs=2, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed += choice.logprobs.content
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [
        (e.token, round(e.logprob, 4)) for e in content
    ]
    plain = openai_client.chat.completions.create(**options).choices[0]
    assert all(entry.top_logprobs == [] for entry in plain.logprobs.content)
    assert openai_client.chat.completions.create(**{**options, "logprobs": False}).choices[0].logprobs is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"logprobs": True, "top_logprobs": False}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": 1}, "logprobs"),
        ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages.0.role"),
        ({"messages": [{"role": "user"}]}, "messages.0.content"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "messages.0.role"),
        ({"n": True}, "n"),
    ],
)
def test_chat_refuses_what_openai_refuses(client, body, param):
    request = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, **body}
    response = client.post("/v1/chat/completions", json=request)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)


def test_too_many_prompts_are_refused_naming_the_prompt_unless_n_was_raised(client):
    too_many = client.post("/v1/completions", json={"prompt": ["x"] * 65, "max_tokens": 1})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "prompt"
    product = client.post("/v1/completions", json={"prompt": ["x"] * 9, "n": 8, "max_tokens": 1})
    assert product.status_code == 400 and product.json()["error"]["param"] == "n"


def test_the_official_client_lists_and_retrieves_the_model(openai_client):
    openai = pytest.importorskip("openai")
    [listed] = openai_client.models.list().data
    model = openai_client.models.retrieve("tiny-byte")
    assert (model.id, model.object, model.owned_by) == ("tiny-byte", "model", "txl-serve")
    assert model.model_dump() == listed.model_dump() and model.model_extra["serving"]["device"] == "cpu"
    with pytest.raises(openai.NotFoundError) as unknown:
        openai_client.models.retrieve("gpt-4o")
    assert unknown.value.code == "model_not_found" and unknown.value.param == "model"


def test_chat_refuses_what_it_cannot_do(client):
    image = [{"type": "image_url", "image_url": {"url": "data:,"}}]
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": image}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages.0.content"
    empty = client.post("/v1/chat/completions", json={"messages": []})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "messages"


# ---------------------------------------------------------------------------------------------- OpenAI's behaviour


def test_an_echoed_prompt_starts_with_a_null_logprob_and_alternatives_hold_the_chosen_token(openai_client):
    """As OpenAI: the first token of an echoed prompt has no log-prob (nothing of the prompt precedes it), and
    each position's top_logprobs hold the chosen token even when it is not among the top n."""
    scored = openai_client.completions.create(
        model="tiny-byte",
        prompt="Call me Ishmael.",
        echo=True,
        logprobs=1,
        max_tokens=6,
        temperature=1,
        seed=4,
    )
    logprobs = scored.choices[0].logprobs
    assert (
        logprobs.tokens[0] == "C" and logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    )
    rows = list(zip(logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True))
    assert len(rows) == len("Call me Ishmael.") - 1 + 6
    for token, logprob, top in rows:
        assert len(top) in (1, 2) and logprob in top.values()
        if len(token) == 1 and token.isprintable() and token.isascii():  # a byte's text is its character
            assert top[token] == logprob
    assert any(len(top) == 2 for _, _, top in rows)  # the tiny random model often picks an unlikely byte


def test_openai_routes_answer_errors_as_openai_does(openai_client, server):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError) as out_of_range:
        openai_client.completions.create(model="tiny-byte", prompt="x", max_tokens=1, temperature=3)
    error = out_of_range.value
    assert error.status_code == 400 and (error.type, error.param, error.code) == (
        "invalid_request_error", "temperature", None
    )  # fmt: skip
    with pytest.raises(openai.NotFoundError) as unknown:
        openai_client.completions.create(model="gpt-4o", prompt="x", max_tokens=1)
    assert (unknown.value.status_code, unknown.value.type, unknown.value.code) == (
        404, "invalid_request_error", "model_not_found"
    )  # fmt: skip
    assert "gpt-4o" in unknown.value.message and "tiny-byte" in unknown.value.message
    with pytest.raises(openai.NotFoundError) as unknown_in_chat:
        openai_client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    assert unknown_in_chat.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad_chat:
        openai_client.chat.completions.create(
            model="tiny-byte", messages=[{"role": "user", "content": "Hi"}], n=0
        )
    assert (bad_chat.value.type, bad_chat.value.param) == ("invalid_request_error", "n")
    stranger = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as wrong_key:
        stranger.models.list()
    assert wrong_key.value.code == "invalid_api_key"


def test_the_native_routes_keep_their_own_error_shape(client):
    session = client.post("/v1/sessions", json={"text": "x"}).json()
    response = client.post(f"/v1/sessions/{session['id']}/generate", json={"temperature": 300})
    assert response.status_code == 422
    error = response.json()["error"]
    assert set(error) == {"type", "message", "param"} and (error["type"], error["param"]) == (
        "invalid_request", "temperature"
    )  # fmt: skip
