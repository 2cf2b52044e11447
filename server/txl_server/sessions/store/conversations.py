"""Conversations (OpenAI's Conversations API) in Redis: a conversation lives on a session, and is stored beside it.

`c:{session}`, a hash: its owner, creation time, metadata, the session version its items describe, how many of its
items the memory has read (`fed`: the first ones; those added since are fed before the next response), and how the
text before its next turn ended (a turn of messages, at the template's turn end: responses.py's record has the
same two fields). `ci:{session}`, a list: its items, oldest first, each as JSON. Both live as long as the session.
`cl:{session}`: the lock a turn holds on the conversation (one turn, or one change of items, at a time).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import anyio
from redis.exceptions import RedisError

from ...errors import Conflict
from .plumbing import RedisStore, field_args, text
from .sessions import SessionStore

CONVERSATION_PREFIX = "conv_"


def conversation_id(session_id: str) -> str:
    return f"{CONVERSATION_PREFIX}{session_id}"


def session_of(conversation: str) -> str | None:
    """The session a conversation id names, or None if it is not one."""
    if not conversation.startswith(CONVERSATION_PREFIX):
        return None
    session = conversation[len(CONVERSATION_PREFIX) :]
    return session if 0 < len(session) <= 64 and session.replace("-", "").replace("_", "").isalnum() else None


@dataclass
class ConversationRecord:
    session_id: str
    owner: str
    created_at: int
    metadata: dict[str, str]
    version: int  # the session's version its fed items describe
    fed: int = 0
    messages: bool = False
    turn_end: bool = False
    items: list[dict[str, Any]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return conversation_id(self.session_id)

    @property
    def pending(self) -> list[dict[str, Any]]:
        """Items added since the memory last read: fed before the next response."""
        return self.items[self.fed :]

    def fields(self) -> dict[str, str]:
        return {
            "owner": self.owner,
            "created_at": str(self.created_at),
            "metadata": json.dumps(self.metadata),
            "version": str(self.version),
            "messages": "1" if self.messages else "0",
            "turn_end": "1" if self.turn_end else "0",
        }

    @classmethod
    def of(cls, session_id: str, raw: dict[str, str], items: list[dict[str, Any]]) -> ConversationRecord:
        return cls(
            session_id,
            raw["owner"],
            int(raw["created_at"]),
            json.loads(raw["metadata"]),
            int(raw["version"]),
            int(raw.get("fed", "0")),
            raw.get("messages") == "1",
            raw.get("turn_end") == "1",
            items,
        )


class ConversationLocked(Conflict):
    def __init__(self) -> None:
        super().__init__(
            "another response or change is in progress in this conversation: retry when it has finished",
            param="conversation",
            code="conversation_locked",
        )


class ConversationStore(RedisStore):
    def __init__(self, sessions: SessionStore, *, replica: str = "") -> None:
        super().__init__(sessions.redis, prefix=sessions.prefix)
        self.replica = replica
        self._write = self.script("conversation_write")
        self._get = self.script("conversation_get")
        self._delete_item = self.script("conversation_delete_item")
        self._release = self.script("delete_if_held")
        self._renew = self.script("renew_if_held")

    def _keys(self, session_id: str) -> list[str]:
        k = self.keys
        return [k.conversation(session_id), k.conversation_items(session_id), k.session(session_id)]

    async def write(
        self, record: ConversationRecord, new_items: list[dict[str, Any]], *, all_fed: bool = False
    ) -> bool:
        """Writes the record's fields and appends `new_items` (with `all_fed`, every item is then read by the
        memory); False if the session is gone."""
        args = [*field_args(record.fields()), "1" if all_fed else "0"]
        args += [json.dumps(item, ensure_ascii=False, separators=(",", ":")) for item in new_items]
        keys = self._keys(record.session_id)
        return bool(await self.call(lambda: self._write(keys=keys, args=args)))

    async def find(self, owner: str, session_id: str) -> ConversationRecord | None:
        """The owner's conversation on the session; None if there is none (or it is another owner's)."""
        keys = self._keys(session_id)
        reply = await self.call(lambda: self._get(keys=keys))
        if not reply:
            return None
        flat = [text(x) for x in reply[0]]
        raw = dict(zip(flat[::2], flat[1::2], strict=True))
        if not secrets.compare_digest(raw.get("owner", ""), owner):
            return None
        return ConversationRecord.of(session_id, raw, [json.loads(text(x)) for x in reply[1]])

    async def delete_item(self, session_id: str, item_id: str) -> int:
        """1 deleted, 0 no such item, -1 the memory has read it (nothing changed)."""
        keys = self._keys(session_id)[:2]
        return int(await self.call(lambda: self._delete_item(keys=keys, args=[item_id])))

    async def delete(self, session_id: str) -> None:
        keys = self._keys(session_id)[:2]
        await self.call(lambda: self.redis.delete(*keys))

    @asynccontextmanager
    async def locked(self, session_id: str, ttl_seconds: float) -> AsyncIterator[None]:
        """The conversation's lock while the block runs (renewed meanwhile: a turn may outlive its TTL), or
        ConversationLocked at once if another turn or change holds it."""
        key, token = self.keys.conversation_lock(session_id), f"{self.replica}/{secrets.token_hex(16)}"
        ttl_ms = max(1, int(ttl_seconds * 1000))
        if not await self.call(lambda: self.redis.set(key, token, nx=True, px=ttl_ms)):
            raise ConversationLocked()

        async def keep() -> None:
            while True:
                await asyncio.sleep(ttl_seconds / 3)
                with suppress(RedisError, OSError):
                    await self._renew(keys=[key], args=[token, ttl_ms])

        renewer = asyncio.create_task(keep())
        try:
            yield
        finally:
            renewer.cancel()
            with anyio.CancelScope(shield=True), suppress(RedisError, OSError):  # else it expires by itself
                await self._release(keys=[key], args=[token])
