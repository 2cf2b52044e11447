"""Conversations from the SDK (sync and async) and the `txl` command line, against a real server: replies feed
only the conversation's new text, background replies are polled or cancelled, items are listed."""

from __future__ import annotations

import json
import time

import pytest
from txl_client import AsyncClient, Client, Conversation, InvalidRequest, NotFound

from .conftest import API_KEY
from .test_cli import TXL, run


@pytest.fixture
def client(server):
    with Client(server.url, API_KEY) as client:
        yield client


def test_a_conversation_replies_on_its_memory_and_lists_its_items(client):
    conversation = client.conversations.create(metadata={"topic": "sea"})
    assert isinstance(conversation, Conversation) and conversation.id.startswith("conv_")
    first = client.conversations.reply(
        conversation.id, "The sea was calm", max_output_tokens=6, temperature=0
    )
    second = client.conversations.reply(conversation.id, " until", max_output_tokens=6, temperature=0)
    assert second.usage["input_tokens_details"]["cached_tokens"] > 0
    assert second.usage["input_tokens"] - second.usage["input_tokens_details"]["cached_tokens"] == len(
        " until"
    )
    items = client.conversations.items(conversation.id)
    assert [(i.role, i.text) for i in items] == [
        ("user", "The sea was calm"),
        ("assistant", first.text),
        ("user", " until"),
        ("assistant", second.text),
    ]
    assert client.conversations.update(conversation.id, metadata={"topic": "land"}).metadata == {
        "topic": "land"
    }
    with pytest.raises(InvalidRequest):  # messages need a chat template, which this server has none of
        client.conversations.add_items(conversation.id, [{"role": "user", "content": "x"}])
    client.conversations.delete(conversation.id)
    with pytest.raises(NotFound):
        client.conversations.get(conversation.id)


def test_a_background_reply_is_polled_to_its_end_or_cancelled(client):
    conversation = client.conversations.create()
    queued = client.conversations.reply(conversation.id, "Waves", max_output_tokens=6, background=True)
    assert queued.status in ("queued", "in_progress")
    deadline = time.monotonic() + 30
    reply = queued
    while reply.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.02)
        reply = client.conversations.response(queued.id)
    assert reply.status == "incomplete" and reply.text
    assert client.conversations.cancel(reply.id).status == "incomplete"  # finished: as it was
    running = client.conversations.reply(conversation.id, " and", max_output_tokens=500, background=True)
    assert client.conversations.cancel(running.id).status in ("cancelled", "incomplete")
    if client.conversations.response(running.id).status == "cancelled":
        assert len(client.conversations.items(conversation.id)) == 2  # nothing of it was kept


async def test_the_async_client_replies_in_a_conversation(server):
    async with AsyncClient(server.url, API_KEY) as client:
        conversation = await client.conversations.create()
        reply = await client.conversations.reply(conversation.id, "Gulls", max_output_tokens=4, temperature=0)
        assert reply.text and len(await client.conversations.items(conversation.id)) == 2
        await client.conversations.delete(conversation.id)


@pytest.mark.skipif(
    not __import__("pathlib").Path(TXL).exists(), reason="the txl console script is not installed"
)
def test_txl_conversations_new_say_items_rm(server):
    env = {"TXL_URL": server.url, "TXL_API_KEY": API_KEY}
    made = run("conversations", "new", env=env)
    assert made.returncode == 0, made.stderr
    conversation = made.stdout.strip()
    said = run(
        "conversations", "say", conversation, "Harbour", "--max-tokens", "4", "--temperature", "0", env=env
    )
    assert said.returncode == 0, said.stderr
    listed = run("conversations", "items", conversation, "--json", env=env)
    items = json.loads(listed.stdout)
    assert [i["role"] for i in items] == ["user", "assistant"] and items[1]["content"][0][
        "text"
    ] == said.stdout[:-1]
    assert run("conversations", "rm", conversation, env=env).returncode == 0
    missing = run("conversations", "show", conversation, env=env)
    assert missing.returncode == 1 and "404" in missing.stderr
