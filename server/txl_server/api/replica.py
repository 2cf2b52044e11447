"""`X-TXL-Replica` on every response: which server process answered.

Behind a proxy several replicas share one address; the header tells a client, an operator reading a log, or a
test which one served a request (and so whether a session stayed on its replica). The name is `TXL_REPLICA_ID`,
else the host name and the port (`HOST-8000`): several servers on one host, one per GPU, are told apart.
"""

from __future__ import annotations

import re
import socket

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..settings import Settings
from .middleware import HttpMiddleware

REPLICA_HEADER = "X-TXL-Replica"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def replica_name(settings: Settings) -> str:
    """The settings' replica id, else `HOST-PORT` (the host name reduced to characters safe in a header and a log
    line, cut to fit 64 with the port)."""
    if settings.replica_id:
        return settings.replica_id
    suffix = f"-{settings.port}"
    host = _UNSAFE.sub("-", socket.gethostname())[: 64 - len(suffix)] or "unnamed"
    return host + suffix


class ReplicaHeader(HttpMiddleware):
    """Adds `X-TXL-Replica: NAME` to every HTTP response that passes through it."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        super().__init__(app)
        self.header = (REPLICA_HEADER.lower().encode("latin-1"), replica.encode("latin-1"))

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named)
