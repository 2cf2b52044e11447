"""Conversations: `client.conversations` (sync) and `async_client.conversations` (async), over their client's
transport (OpenAI's Conversations API, which the official `openai` client speaks too).

A conversation is a session and its items; each reply feeds only the conversation's new text to its memory:

    conversation = client.conversations.create(items=[{"role": "user", "content": "Hi"}])
    reply = client.conversations.reply(conversation.id, "What is the tide doing?", max_output_tokens=64)
    print(reply.text, reply.usage["input_tokens_details"]["cached_tokens"])
    for item in client.conversations.items(conversation.id):
        print(item.role, item.text)

With `background=True` a reply is answered at once (`queued`); `client.conversations.response(id)` polls it and
`client.conversations.cancel(id)` cancels it (nothing of it is committed).
"""

from __future__ import annotations

from typing import Any, Literal

from .calls import Call, compact, path_segment
from .endpoints import Endpoint
from .operations import Operation, json_answer
from .transport import AsyncTransport, Transport
from .types import Conversation, ConversationItem, Reply

Message = dict[str, Any]  # {"role": ..., "content": ...}


def conversation_path(conversation_id: str) -> str:
    return "/v1/conversations/" + path_segment(conversation_id, "conversation")


def _items(body: Any) -> list[ConversationItem]:
    return [ConversationItem.model_validate(item) for item in body["data"]]


# ---------------------------------------------------------------------------------------------- operations


def create(
    items: list[Message] | None = None, *, metadata: dict[str, str] | None = None
) -> Operation[Conversation]:
    """A new conversation; its `items` (messages) are read by its memory before its first reply."""
    body = compact(items=items, metadata=metadata)
    return json_answer(Call("POST", "/v1/conversations", body), Conversation.model_validate)


def get(conversation_id: str) -> Operation[Conversation]:
    return json_answer(Call("GET", conversation_path(conversation_id)), Conversation.model_validate)


def update(conversation_id: str, *, metadata: dict[str, str]) -> Operation[Conversation]:
    """Replaces the conversation's metadata."""
    call = Call("POST", conversation_path(conversation_id), {"metadata": metadata})
    return json_answer(call, Conversation.model_validate)


def delete(conversation_id: str) -> Operation[None]:
    """Deletes the conversation, its items and its session."""
    return json_answer(Call("DELETE", conversation_path(conversation_id)), lambda body: None)


def items(
    conversation_id: str, *, order: Literal["asc", "desc"] = "asc", limit: int = 100, after: str | None = None
) -> Operation[list[ConversationItem]]:
    """A page of the conversation's items, oldest first unless `order` is "desc"."""
    params = {k: str(v) for k, v in compact(order=order, limit=limit, after=after).items()}
    return json_answer(Call("GET", conversation_path(conversation_id) + "/items", params=params), _items)


def add_items(conversation_id: str, items: list[Message]) -> Operation[list[ConversationItem]]:
    """Adds messages, which the memory reads before the next reply."""
    call = Call("POST", conversation_path(conversation_id) + "/items", {"items": items})
    return json_answer(call, _items)


def delete_item(conversation_id: str, item_id: str) -> Operation[Conversation]:
    """Deletes an item the memory has not read yet (a Conflict, `item_in_memory`, for one it has)."""
    path = conversation_path(conversation_id) + "/items/" + path_segment(item_id, "item")
    return json_answer(Call("DELETE", path), Conversation.model_validate)


def reply(
    conversation_id: str,
    input: str | list[Message],
    *,
    max_output_tokens: int | None = None,
    temperature: float | None = None,
    instructions: str | None = None,
    background: bool = False,
) -> Operation[Reply]:
    """The model's reply to `input` (a string the model continues, or messages), which becomes part of the
    conversation; only the conversation's new text is fed. With `background`, answered at once."""
    body = {
        "conversation": conversation_id,
        "input": input,
        **compact(max_output_tokens=max_output_tokens, temperature=temperature, instructions=instructions),
        **({"background": True} if background else {}),
    }
    return json_answer(Call("POST", "/v1/responses", body), Reply.model_validate)


def response(response_id: str) -> Operation[Reply]:
    """A response as it stands (a background one: poll until its status is no longer queued or in_progress)."""
    return json_answer(
        Call("GET", "/v1/responses/" + path_segment(response_id, "response")), Reply.model_validate
    )


def cancel(response_id: str) -> Operation[Reply]:
    """Cancels a background response (nothing of it is committed); one that finished is answered as it is."""
    path = "/v1/responses/" + path_segment(response_id, "response") + "/cancel"
    return json_answer(Call("POST", path), Reply.model_validate)


# ---------------------------------------------------------------------------------------------- the APIs


class ConversationEndpoints:
    """Create, get, update and delete conversations; list, add and delete their items; reply in them."""

    create = Endpoint(create)
    get = Endpoint(get)
    update = Endpoint(update)
    delete = Endpoint(delete)
    items = Endpoint(items)
    add_items = Endpoint(add_items)
    delete_item = Endpoint(delete_item)
    reply = Endpoint(reply)
    response = Endpoint(response)
    cancel = Endpoint(cancel)


class Conversations(ConversationEndpoints):
    """`client.conversations`."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport


class AsyncConversations(ConversationEndpoints):
    """`async_client.conversations`: see `Conversations`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self.transport = transport
