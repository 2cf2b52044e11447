"""`AsyncClient`: the asyncio SDK over `httpx.AsyncClient`; the same methods as `Client`, awaited.

async with AsyncClient() as txl:
    session = await txl.create_session(text="Once upon a time")
    async with await txl.generate(session.id, max_tokens=20, stream=True) as stream:
        async for token in stream:
            print(token.text, end="", flush=True)
"""

from __future__ import annotations

from typing import Literal, Unpack, overload

import httpx

from . import operations
from .client_base import ClientBase
from .memories import AsyncMemories
from .operations import GenerateOptions
from .options import Options
from .streams import AsyncGenerateStream
from .transport import AsyncTransport
from .types import GenerateResult


class AsyncClient(ClientBase[AsyncTransport, httpx.AsyncClient]):
    """See `Client`: the same options, environment variables, retries and errors; `on_progress` may be a plain
    function or a coroutine function."""

    def open_transport(self, options: Options, http_client: httpx.AsyncClient | None) -> AsyncTransport:
        return AsyncTransport.open(options, http_client)

    @property
    def memories(self) -> AsyncMemories:
        """Preloaded memories: documents read once, that sessions start from (txl_client.memories)."""
        return AsyncMemories(self.transport)

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @overload
    async def generate(
        self,
        session_id: str,
        text: str = "",
        *,
        stream: Literal[False] = False,
        **options: Unpack[GenerateOptions],
    ) -> GenerateResult: ...
    @overload
    async def generate(
        self, session_id: str, text: str = "", *, stream: Literal[True], **options: Unpack[GenerateOptions]
    ) -> AsyncGenerateStream: ...
    async def generate(
        self, session_id: str, text: str = "", *, stream: bool = False, **options: Unpack[GenerateOptions]
    ) -> GenerateResult | AsyncGenerateStream:
        operation = operations.generate(session_id, text, **options)
        if stream:
            return await self.transport.stream(operation)
        return await self.transport.run(operation)

    generate.__doc__ = operations.generate.__doc__
