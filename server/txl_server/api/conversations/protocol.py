"""OpenAI's Conversations protocol as this server speaks it: what `/v1/conversations` takes (pydantic, at the edge
only), the conversation object and its items (messages, as the Responses API lists its input items)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..responses.protocol import (
    MAX_METADATA_PAIRS,
    InputItem,
    MetadataKey,
    MetadataValue,
)
from ..shared.request_body import RequestBody

MAX_ITEMS = 20  # OpenAI's limit on the items one request adds

Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(max_length=MAX_METADATA_PAIRS)]
Items = Annotated[list[InputItem], Field(max_length=MAX_ITEMS)]


class ConversationCreateRequest(RequestBody):
    model_config = ConfigDict(extra="ignore")
    items: Items | None = Field(None, description="Messages the memory reads before the first response")
    metadata: Metadata | None = None


class ConversationUpdateRequest(RequestBody):
    model_config = ConfigDict(extra="ignore")
    metadata: Metadata


class ItemsCreateRequest(RequestBody):
    model_config = ConfigDict(extra="ignore")
    items: Annotated[list[InputItem], Field(min_length=1, max_length=MAX_ITEMS)]


class ConversationObject(BaseModel):
    id: str = Field(..., description="conv_{session id}: the session the conversation lives on")
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str]


class DeletedConversation(BaseModel):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: Literal[True] = True


class ItemContent(BaseModel):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class ConversationItem(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[ItemContent]


class ConversationItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ConversationItem]
    first_id: str | None
    last_id: str | None
    has_more: bool
