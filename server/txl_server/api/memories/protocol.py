"""What the memories routes take and return (pydantic, at the edge only)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from ...sessions.memories import MAX_NAME_CHARS
from ..shared.limits import TtlSeconds
from ..shared.request_body import RequestBody
from ..shared.timestamps import Seconds, SecondsUp


def _never_null(schema: dict[str, Any]) -> None:
    """The schema of a field that may be left out, but not sent as null: its own type's alone."""
    members = [member for member in schema.pop("anyOf", []) if member.get("type") != "null"]
    schema.update(members[0])


class MemoryCreate(RequestBody):
    model_config = ConfigDict(extra="forbid")
    # Documents are limited by the body size (TXL_MAX_BODY_BYTES), as scoring's are: memories exist for long ones.
    text: str = Field(..., min_length=1, description="The document to read")
    name: str | None = Field(None, max_length=MAX_NAME_CHARS, description="Your label for it")
    ttl_seconds: TtlSeconds | None = Field(
        None, description="Expires this long after creation (not extended by use); default as sessions"
    )
    metadata: dict[str, Any] | None = Field(None, description="Your own JSON, returned with the memory")
    stream: StrictBool = Field(
        False, description="Stream progress events while the document is read, then the memory"
    )


class MemoryUpdate(RequestBody):
    # At least one field: an update that changes nothing is refused (memories/serving.py `update`).
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    # Optional, but not null: a memory always expires (`update` refuses a null, and the schema has none).
    ttl_seconds: TtlSeconds | None = Field(
        None, description="Expires this long from now", json_schema_extra=_never_null
    )
    name: str | None = Field(None, max_length=MAX_NAME_CHARS, description="A new label (null: none)")
    metadata: dict[str, Any] | None = Field(None, description="Replaces the metadata (null: none)")


class MemoryObject(BaseModel):
    model_config = ConfigDict(from_attributes=True)  # made from a MemoryMeta
    id: str
    object: Literal["memory"] = "memory"
    name: str | None
    tokens: int = Field(..., description="Tokens the document became")
    bytes: int = Field(..., description="UTF-8 bytes of the document")
    mem_tokens: int = Field(..., description="Positions its memory holds: the same for any long document")
    mem_len: int
    model: str
    created_at: Seconds
    updated_at: Seconds
    expires_at: SecondsUp
    metadata: dict[str, Any]


class MemoryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[MemoryObject] = Field(..., description="Oldest first")
