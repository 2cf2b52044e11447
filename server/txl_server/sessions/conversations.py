"""Conversations (OpenAI's Conversations API) on sessions: a conversation is a session, and its items.

A conversation is made with a new session and the items it is given; a response in it (`conversation` on
`POST /v1/responses`) continues its session, feeding only the items added by hand since its last turn and the
response's own input, then appends that input and the reply as items. The items the memory has read are its
first `fed` ones (store/conversations.py); those added since are fed before the next response, and can be deleted
until then. Deleting an item the memory has read is refused (409, `item_in_memory`): what followed it was
computed from it, and the memory cannot forget it without replaying the rest (fork the session at an earlier
version with the Sessions API for that).

One turn (or change of items) at a time holds the conversation's lock; another is refused at once with 409
`conversation_locked`, as OpenAI answers. A conversation's session moves only with its conversation: if it was
moved by other means (the Sessions API), its next turn is refused with 409 `conversation_out_of_step`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

from ..errors import Conflict, NotFound
from .service import SessionService
from .store.conversations import ConversationRecord, ConversationStore, session_of
from .store.sessions import SessionMeta

# ConversationRecord too: the API reads conversations through this service, never through their store.
__all__ = [
    "ConversationNotFound",
    "ConversationOutOfStep",
    "ConversationRecord",
    "ConversationService",
    "ConversationTurn",
    "ItemInMemory",
]


class ConversationNotFound(NotFound):
    def __init__(self, conversation_id: str) -> None:
        shown = conversation_id[:100]
        super().__init__(f"no conversation {shown!r}", param="conversation_id", code="conversation_not_found")


class ItemInMemory(Conflict):
    def __init__(self) -> None:
        super().__init__(
            "the conversation's memory has read this item, and what followed was computed from it: it cannot be "
            "deleted (items added since the last response can)",
            param="item_id",
            code="item_in_memory",
        )


class ConversationOutOfStep(Conflict):
    def __init__(self, session_version: int, version: int) -> None:
        super().__init__(
            f"the conversation's session was changed outside the conversation (it is at version {session_version}, "
            f"the conversation at {version})",
            param="conversation",
            code="conversation_out_of_step",
        )


@dataclass(frozen=True)
class ConversationTurn:
    """A turn holding its conversation: the conversation as it is, and its session at the version it describes."""

    record: ConversationRecord
    meta: SessionMeta


class ConversationService:
    def __init__(self, service: SessionService, store: ConversationStore) -> None:
        self.service = service
        self.store = store

    async def create(
        self, owner: str, items: list[dict[str, Any]], metadata: dict[str, str]
    ) -> ConversationRecord:
        """A new conversation: a new session, and `items`, which its memory reads before its first response."""
        meta = await self.service.create(owner)
        record = ConversationRecord(meta.id, owner, int(time.time()), dict(metadata), meta.version, items=[])
        if not await self.store.write(record, items):
            raise NotFound("the conversation's session expired at once", param="conversation_id")
        record.items = list(items)
        return record

    async def get(self, owner: str, conversation_id: str) -> ConversationRecord:
        session = session_of(conversation_id)
        record = await self.store.find(owner, session) if session is not None else None
        if record is None:
            shown = conversation_id[:100]
            raise NotFound(
                f"no conversation {shown!r}", param="conversation_id", code="conversation_not_found"
            )
        return record

    async def update(self, owner: str, conversation_id: str, metadata: dict[str, str]) -> ConversationRecord:
        record = await self.get(owner, conversation_id)
        record.metadata = dict(metadata)
        await self.store.write(record, [])
        return record

    async def delete(self, owner: str, conversation_id: str) -> None:
        """Deletes the conversation, its items and its session (once no turn holds it)."""
        record = await self.get(owner, conversation_id)
        async with self.store.locked(record.session_id, self.service.settings.lease_ttl_seconds):
            await self.store.delete(record.session_id)
            with suppress(NotFound):
                await self.service.delete(owner, record.session_id)

    async def add_items(
        self, owner: str, conversation_id: str, items: list[dict[str, Any]]
    ) -> ConversationRecord:
        """Appends `items`, which the memory reads before the next response."""
        record = await self.get(owner, conversation_id)
        async with self.store.locked(record.session_id, self.service.settings.lease_ttl_seconds):
            record = await self.get(owner, conversation_id)
            if not await self.store.write(record, items):
                raise ConversationNotFound(conversation_id)
            record.items += items
        return record

    async def delete_item(self, owner: str, conversation_id: str, item_id: str) -> ConversationRecord:
        """Deletes an item the memory has not read yet; 409 `item_in_memory` for one it has."""
        record = await self.get(owner, conversation_id)
        async with self.store.locked(record.session_id, self.service.settings.lease_ttl_seconds):
            deleted = await self.store.delete_item(record.session_id, item_id)
        if deleted == 0:
            raise NotFound(f"no item {item_id[:100]!r} in this conversation", param="item_id")
        if deleted < 0:
            raise ItemInMemory()
        return await self.get(owner, conversation_id)

    @asynccontextmanager
    async def turn(self, owner: str, conversation_id: str) -> AsyncIterator[ConversationTurn]:
        """The conversation, held for one turn: its record and its session, at the version its items describe."""
        record = await self.get(owner, conversation_id)
        async with self.store.locked(record.session_id, self.service.settings.lease_ttl_seconds):
            record = await self.get(owner, conversation_id)
            meta = await self.service.get(owner, record.session_id)
            if meta.version != record.version:
                raise ConversationOutOfStep(meta.version, record.version)
            yield ConversationTurn(record, meta)

    async def commit(
        self,
        turn: ConversationTurn,
        version: int,
        items: list[dict[str, Any]],
        *,
        messages: bool,
        turn_end: bool,
    ) -> None:
        """After a turn committed `version`: its input and reply appended as items, every item read."""
        record = turn.record
        record.version, record.messages, record.turn_end = version, messages, turn_end
        await self.store.write(record, items, all_fed=True)
        record.items += items
        record.fed = len(record.items)
