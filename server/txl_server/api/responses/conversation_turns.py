"""A response in a conversation: the conversation held for the turn (sessions/conversations.py), the items added
by hand since its last turn as the messages written before the input's, and, once the turn committed, its input
and its reply appended as the conversation's items."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...sessions.conversations import ConversationService, ConversationTurn
from ...sessions.responses import TurnPlace
from ..shared.chat_template import ChatMessage
from .turn_input import input_items

if TYPE_CHECKING:
    from .reply import Reply


def item_text(item: dict[str, Any]) -> str:
    return "".join(str(part.get("text", "")) for part in item.get("content", []))


@dataclass
class ConversationTurns:
    conversations: ConversationService
    held: ConversationTurn

    @classmethod
    async def hold(
        cls,
        conversations: ConversationService,
        owner: str,
        conversation_id: str,
        stack: contextlib.AsyncExitStack,
    ) -> ConversationTurns:
        """The conversation, held (its lock) until `stack` closes."""
        held = await stack.enter_async_context(conversations.turn(owner, conversation_id))
        return cls(conversations, held)

    @property
    def ending(self) -> Any:
        """How the memory's text ended (responses.py's TurnEnding): the conversation's last turn's."""
        return self.held.record if self.held.record.fed else None

    @property
    def before(self) -> list[ChatMessage]:
        """The items added since the last turn, which the memory reads before this turn's input."""
        return [ChatMessage(role=item["role"], content=item_text(item)) for item in self.held.record.pending]

    def place(self) -> TurnPlace:
        meta = self.held.meta
        cached = meta.mem_tokens if meta.tokens else 0  # a new conversation's memory holds only the start
        return TurnPlace(meta, cached, expected_version=meta.version)

    async def commit(self, reply: Reply) -> None:
        """The turn committed: its input and its reply become the conversation's items, all read."""
        items = [*input_items(reply.body, reply.messages, len(self.before)), reply.message().model_dump()]
        await self.conversations.commit(
            self.held,
            reply.started.version,
            items,
            messages=reply.messages is not None,
            turn_end=reply.turn_end,
        )
