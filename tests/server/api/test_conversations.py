"""OpenAI's Conversations API on a real server and Redis, driven by the official `openai` client: a conversation
is a session; its next turn feeds only its new text and equals one request with the whole transcript; items added
by hand are read before the next response; an item the memory read cannot be deleted; tenants are kept apart."""

from __future__ import annotations

import pytest
from txl_server.settings import Persistence

from tests.helpers.live_server import client_fixture, live_server_fixture
from tests.helpers.tiny_models import make_text_model_dir

openai = pytest.importorskip("openai")

KEY_A, KEY_B = "key-conversations-a", "key-conversations-b"
GREEDY = {"temperature": 0, "max_output_tokens": 8}


@pytest.fixture(scope="module")
def text_model_dir(tmp_path_factory):
    return make_text_model_dir(tmp_path_factory.mktemp("models") / "tiny-byte")


server = live_server_fixture(
    "conversations",
    model="text_model_dir",
    api_keys=f"{KEY_A},{KEY_B}",
    chat_template="transcript",
    persistence=Persistence.ALWAYS,
)
http = client_fixture(KEY_A)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_A, max_retries=0)


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def test_create_retrieve_update_delete(client):
    conversation = client.conversations.create(metadata={"topic": "tides"})
    assert conversation.id.startswith("conv_") and conversation.object == "conversation"
    assert client.conversations.retrieve(conversation.id).metadata == {"topic": "tides"}
    assert client.conversations.update(conversation.id, metadata={"topic": "wind"}).metadata == {
        "topic": "wind"
    }
    deleted = client.conversations.delete(conversation.id)
    assert deleted.deleted and deleted.id == conversation.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)


def test_a_turn_feeds_only_its_new_text_and_equals_one_request_with_the_whole_transcript(client, http):
    conversation = client.conversations.create()
    first = client.responses.create(conversation=conversation.id, input="The tide came in", **GREEDY)
    assert first.conversation.id == conversation.id
    second = client.responses.create(conversation=conversation.id, input=" and the boats rose", **GREEDY)
    details = second.usage.input_tokens_details
    assert details.cached_tokens > 0  # the conversation's memory: only the new text was fed
    assert second.usage.input_tokens - details.cached_tokens == len(" and the boats rose")
    whole = client.responses.create(
        input="The tide came in" + first.output_text + " and the boats rose", store=False, **GREEDY
    )
    assert second.output_text == whole.output_text
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [(i.role, i.content[0].text) for i in items] == [
        ("user", "The tide came in"),
        ("assistant", first.output_text),
        ("user", " and the boats rose"),
        ("assistant", second.output_text),
    ]
    assert client.conversations.items.retrieve(items[1].id, conversation_id=conversation.id).id == items[1].id
    session = http.get(f"/v1/sessions/{conversation.id.removeprefix('conv_')}").json()
    assert session["version"] == 3  # a conversation is a session: one version per turn


def test_items_added_by_hand_are_read_before_the_next_response(client):
    conversation = client.conversations.create(items=[user("Hello there.")])
    client.conversations.items.create(conversation.id, items=[user("Anyone?")])
    reply = client.responses.create(conversation=conversation.id, input=[user("Say something.")], **GREEDY)
    whole = client.responses.create(
        input=[user("Hello there."), user("Anyone?"), user("Say something.")], store=False, **GREEDY
    )
    assert reply.output_text == whole.output_text
    transcript = "User: Hello there.\nUser: Anyone?\nUser: Say something.\nAssistant:"
    assert reply.usage.input_tokens == len(transcript) and reply.usage.input_tokens_details.cached_tokens == 0
    roles = [i.role for i in client.conversations.items.list(conversation.id, order="asc").data]
    assert roles == ["user", "user", "user", "assistant"]


def test_an_item_not_yet_read_can_be_deleted_one_read_is_a_409(client):
    conversation = client.conversations.create(items=[user("Keep.")])
    client.responses.create(conversation=conversation.id, input=[user("Go.")], **GREEDY)
    pending = client.conversations.items.create(conversation.id, items=[user("Drop me.")]).data[0]
    after = client.conversations.items.delete(pending.id, conversation_id=conversation.id)
    assert after.id == conversation.id
    read = client.conversations.items.list(conversation.id, order="asc").data[0]
    with pytest.raises(openai.ConflictError) as caught:
        client.conversations.items.delete(read.id, conversation_id=conversation.id)
    assert caught.value.body["code"] == "item_in_memory"
    assert len(client.conversations.items.list(conversation.id).data) == 3  # nothing changed


def test_conversation_with_previous_response_id_is_a_400(client):
    conversation = client.conversations.create()
    first = client.responses.create(input="x", **GREEDY)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            conversation=conversation.id, previous_response_id=first.id, input="y", **GREEDY
        )
    assert caught.value.body["param"] == "conversation"


def test_a_turn_while_another_holds_the_conversation_is_a_409(server, client):
    conversation = client.conversations.create()
    store = server.app.state.runtime.service.store
    key = store.keys.conversation_lock(conversation.id.removeprefix("conv_"))
    server.run(store.redis.set(key, "another-turn", px=60_000))
    try:
        with pytest.raises(openai.ConflictError) as caught:
            client.responses.create(conversation=conversation.id, input="x", **GREEDY)
        assert caught.value.body["code"] == "conversation_locked"
    finally:
        server.run(store.redis.delete(key))
    assert client.responses.create(conversation=conversation.id, input="x", **GREEDY).output_text


def test_chaining_to_a_conversations_response_branches_and_leaves_the_conversation_as_it_was(client):
    conversation = client.conversations.create()
    first = client.responses.create(conversation=conversation.id, input="Once", **GREEDY)
    branch = client.responses.create(previous_response_id=first.id, input=" more", **GREEDY)
    assert not branch.id.startswith(f"resp_{conversation.id.removeprefix('conv_')}.")
    again = client.responses.create(conversation=conversation.id, input=" more", **GREEDY)
    assert again.output_text == branch.output_text


def test_tenants_are_kept_apart(server, client):
    conversation = client.conversations.create(items=[user("private")])
    other = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_B, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        other.conversations.items.list(conversation.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.create(conversation=conversation.id, input="x", **GREEDY)
    with pytest.raises(openai.NotFoundError):
        other.conversations.delete(conversation.id)
    assert client.conversations.retrieve(conversation.id).id == conversation.id


def test_bad_input_is_refused_and_changes_nothing(client, http):
    conversation = client.conversations.create()
    too_many = {"items": [user("x")] * 21}
    assert http.post("/v1/conversations", json=too_many).status_code == 400
    image = {"items": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}
    reply = http.post(f"/v1/conversations/{conversation.id}/items", json=image)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "items.0.content"
    assert http.get("/v1/conversations/conv_nothing").status_code == 404
    assert client.conversations.items.list(conversation.id).data == []
