"""The Conversations API on sessions: a conversation is a session and its items (sessions/conversations.py)."""

from __future__ import annotations

from typing import Any, Literal

from ...errors import InvalidRequest
from ...sessions.conversations import ConversationRecord
from ...settings import Settings
from ..responses.paging import page_of
from ..responses.protocol import InputItem, InputMessageItem
from ..shared.chat_template import ChatMessage
from ..shared.limits import check_metadata, check_text
from .protocol import ConversationItem, ConversationItemList, ConversationObject


def conversation_object(record: ConversationRecord) -> ConversationObject:
    return ConversationObject(id=record.id, created_at=record.created_at, metadata=record.metadata)


def new_items(settings: Settings, items: list[InputItem], param: str) -> list[dict[str, Any]]:
    """Items as the conversation keeps them (an id each), their text checked. The memory reads them written out
    with the chat template, so they need one."""
    if items and settings.chat_template is None:
        raise InvalidRequest(
            "message items need a chat template, and this server has none (its model declares none): the "
            "operator sets TXL_CHAT_TEMPLATE (e.g. transcript); or send a response's input as a string, which the "
            "model continues",
            param=param,
        )
    out = []
    for i, item in enumerate(items):
        parts = [item.content] if isinstance(item.content, str) else item.content
        texts = []
        for part in parts:
            if not isinstance(part, str):
                if part.type not in ("input_text", "output_text", "text"):
                    raise InvalidRequest("only text content is supported", param=f"{param}.{i}.content")
                part = part.text
            texts.append(part)
        text = "".join(texts)
        check_text(settings, text, f"{param}.{i}.content")
        message = ChatMessage(role=item.role, content=text)
        out.append(InputMessageItem.of(message.role, text).model_dump(exclude_none=True))
    return out


def page(
    items: list[dict[str, Any]], after: str | None, limit: int, order: Literal["asc", "desc"]
) -> ConversationItemList:
    listed = [ConversationItem.model_validate(i) for i in items]
    return ConversationItemList(**page_of(listed, after, limit, order, "this conversation"))


def checked_metadata(settings: Settings, metadata: dict[str, str] | None) -> dict[str, str]:
    check_metadata(settings, metadata)
    return dict(metadata or {})
