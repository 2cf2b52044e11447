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

import httpx

from .client_base import ClientBase
from .conversations import Conversations
from .memories import Memories
from .options import Options
from .transport import Transport


class Client(ClientBase[Transport, httpx.Client]):
    __doc__ = ClientBase.__doc__

    def open_transport(self, options: Options, http_client: httpx.Client | None) -> Transport:
        return Transport.open(options, http_client)

    @property
    def memories(self) -> Memories:
        """Preloaded memories: documents read once, that sessions start from (txl_client.memories)."""
        return Memories(self.transport)

    @property
    def conversations(self) -> Conversations:
        """Conversations: a session and its items, replied to with OpenAI's Responses API
        (txl_client.conversations)."""
        return Conversations(self.transport)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
