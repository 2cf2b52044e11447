"""`AsyncClient`: the asyncio SDK over `httpx.AsyncClient`; the same methods as `Client`, awaited.

async with AsyncClient() as txl:
    session = await txl.create_session(text="Once upon a time")
    async with await txl.generate(session.id, max_tokens=20, stream=True) as stream:
        async for token in stream:
            print(token.text, end="", flush=True)
"""

from __future__ import annotations

import httpx

from .client_base import ClientBase
from .conversations import AsyncConversations
from .memories import AsyncMemories
from .options import Options
from .transport import AsyncTransport


class AsyncClient(ClientBase[AsyncTransport, httpx.AsyncClient]):
    """See `Client`: the same options, environment variables, retries and errors; `on_progress` may be a plain
    function or a coroutine function."""

    def open_transport(self, options: Options, http_client: httpx.AsyncClient | None) -> AsyncTransport:
        return AsyncTransport.open(options, http_client)

    @property
    def memories(self) -> AsyncMemories:
        """Preloaded memories: documents read once, that sessions start from (txl_client.memories)."""
        return AsyncMemories(self.transport)

    @property
    def conversations(self) -> AsyncConversations:
        """Conversations: a session and its items, replied to with OpenAI's Responses API
        (txl_client.conversations)."""
        return AsyncConversations(self.transport)

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
