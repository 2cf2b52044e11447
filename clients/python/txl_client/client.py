"""`Client`: the synchronous SDK over `httpx.Client`.

from txl_client import Client
with Client("http://127.0.0.1:8000") as txl:
    session = txl.create_session(text="It was a dark and stormy night")
    print(txl.generate(session.id, max_tokens=20, temperature=0).text)
    with txl.generate(session.id, max_tokens=20, stream=True) as stream:
        for token in stream:
            print(token.text, end="", flush=True)
    print(stream.result.session.version)
"""

from __future__ import annotations

from typing import Literal, Unpack, overload

import httpx

from . import operations
from .client_base import ClientBase
from .memories import Memories
from .operations import GenerateOptions
from .options import Options
from .streams import GenerateStream
from .transport import Transport
from .types import GenerateResult


class Client(ClientBase[Transport, httpx.Client]):
    __doc__ = ClientBase.__doc__

    def open_transport(self, options: Options, http_client: httpx.Client | None) -> Transport:
        return Transport.open(options, http_client)

    @property
    def memories(self) -> Memories:
        """Preloaded memories: documents read once, that sessions start from (txl_client.memories)."""
        return Memories(self.transport)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @overload
    def generate(
        self,
        session_id: str,
        text: str = "",
        *,
        stream: Literal[False] = False,
        **options: Unpack[GenerateOptions],
    ) -> GenerateResult: ...
    @overload
    def generate(
        self, session_id: str, text: str = "", *, stream: Literal[True], **options: Unpack[GenerateOptions]
    ) -> GenerateStream: ...
    def generate(
        self, session_id: str, text: str = "", *, stream: bool = False, **options: Unpack[GenerateOptions]
    ) -> GenerateResult | GenerateStream:
        operation = operations.generate(session_id, text, **options)
        return self.transport.stream(operation) if stream else self.transport.run(operation)

    generate.__doc__ = operations.generate.__doc__
