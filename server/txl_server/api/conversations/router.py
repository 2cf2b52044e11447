"""OpenAI's Conversations API: `/v1/conversations` (create, retrieve, update, delete) and
`/v1/conversations/{id}/items` (list, create, retrieve, delete). The official `openai` client's
`client.conversations` and `client.conversations.items` work unchanged; `client.responses.create(conversation=ID)`
continues one."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from ...errors import NotFound
from ..shared.dependencies import AppSettings, Conversations, Tenant
from ..shared.json_body import JsonBodyRoute
from ..shared.openai_errors import OPENAI_ERROR_RESPONSES
from . import serving
from .protocol import (
    ConversationCreateRequest,
    ConversationItem,
    ConversationItemList,
    ConversationObject,
    ConversationUpdateRequest,
    DeletedConversation,
    ItemsCreateRequest,
)

router = APIRouter(tags=["conversations"], responses=OPENAI_ERROR_RESPONSES, route_class=JsonBodyRoute)

Limit = Annotated[int, Query(ge=1, le=100)]
After = Annotated[str | None, Query(max_length=128)]


@router.post("/v1/conversations", response_model=ConversationObject)
async def create_conversation(
    body: ConversationCreateRequest, conversations: Conversations, tenant: Tenant, settings: AppSettings
) -> ConversationObject:
    """A new conversation (a new session); its `items` are read by the memory before its first response."""
    metadata = serving.checked_metadata(settings, body.metadata)
    items = serving.new_items(settings, body.items or [], "items")
    return serving.conversation_object(await conversations.create(tenant, items, metadata))


@router.get("/v1/conversations/{conversation_id}", response_model=ConversationObject)
async def get_conversation(
    conversation_id: str, conversations: Conversations, tenant: Tenant
) -> ConversationObject:
    """A conversation (while its session lives)."""
    return serving.conversation_object(await conversations.get(tenant, conversation_id))


@router.post("/v1/conversations/{conversation_id}", response_model=ConversationObject)
async def update_conversation(
    conversation_id: str,
    body: ConversationUpdateRequest,
    conversations: Conversations,
    tenant: Tenant,
    settings: AppSettings,
) -> ConversationObject:
    """Replaces the conversation's metadata."""
    metadata = serving.checked_metadata(settings, body.metadata)
    return serving.conversation_object(await conversations.update(tenant, conversation_id, metadata))


@router.delete("/v1/conversations/{conversation_id}", response_model=DeletedConversation)
async def delete_conversation(
    conversation_id: str, conversations: Conversations, tenant: Tenant
) -> DeletedConversation:
    """Deletes the conversation, its items and its session."""
    await conversations.delete(tenant, conversation_id)
    return DeletedConversation(id=conversation_id)


@router.get("/v1/conversations/{conversation_id}/items", response_model=ConversationItemList)
async def list_items(
    conversation_id: str,
    conversations: Conversations,
    tenant: Tenant,
    after: After = None,
    limit: Limit = 20,
    order: Literal["asc", "desc"] = "desc",
) -> ConversationItemList:
    """A page of the conversation's items (newest first unless `order` is asc)."""
    record = await conversations.get(tenant, conversation_id)
    return serving.page(record.items, after, limit, order)


@router.post("/v1/conversations/{conversation_id}/items", response_model=ConversationItemList)
async def create_items(
    conversation_id: str,
    body: ItemsCreateRequest,
    conversations: Conversations,
    tenant: Tenant,
    settings: AppSettings,
) -> ConversationItemList:
    """Adds items, which the memory reads before the next response; answers the items added."""
    items = serving.new_items(settings, body.items, "items")
    await conversations.add_items(tenant, conversation_id, items)
    return serving.page(items, None, len(items), "asc")


@router.get("/v1/conversations/{conversation_id}/items/{item_id}", response_model=ConversationItem)
async def get_item(
    conversation_id: str, item_id: str, conversations: Conversations, tenant: Tenant
) -> ConversationItem:
    record = await conversations.get(tenant, conversation_id)
    for item in record.items:
        if item.get("id") == item_id:
            return ConversationItem.model_validate(item)
    raise NotFound(f"no item {item_id[:100]!r} in this conversation", param="item_id")


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}", response_model=ConversationObject)
async def delete_item(
    conversation_id: str, item_id: str, conversations: Conversations, tenant: Tenant
) -> ConversationObject:
    """Deletes an item the memory has not read yet (409 `item_in_memory` for one it has); answers the
    conversation, as OpenAI does."""
    return serving.conversation_object(await conversations.delete_item(tenant, conversation_id, item_id))
