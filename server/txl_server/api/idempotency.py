"""`Idempotency-Key`: a retried request returns the first one's result instead of stepping the session again.

The key is scoped to the tenant, the session and the operation. While the first request runs, a retry gets 409;
once it has finished, a retry gets its response; if it failed, the key is released and a retry runs anew.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import Conflict, InvalidRequest
from ..sessions.store import SessionStore

_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class IdempotentCall:
    def __init__(self, store: SessionStore, owner: str, scope: str, key: str | None, ttl: int) -> None:
        if key is not None and not _KEY.match(key):
            raise InvalidRequest(
                "Idempotency-Key must be 1-128 characters of [A-Za-z0-9._:-]", param="Idempotency-Key"
            )
        self.store, self.owner, self.key, self.ttl = store, owner, f"{scope}:{key}" if key else None, ttl

    async def replay(self) -> dict[str, Any] | None:
        """The stored result of an earlier call with this key, if any; claims the key otherwise."""
        if self.key is None:
            return None
        if await self.store.claim_idempotent(self.owner, self.key, self.ttl):
            return None
        stored = await self.store.get_idempotent(self.owner, self.key)
        if stored is None:  # expired between the two calls: run
            return (
                None
                if await self.store.claim_idempotent(self.owner, self.key, self.ttl)
                else await self.replay()
            )
        if stored.get("state") == "pending":
            raise Conflict("a request with this Idempotency-Key is still in progress")
        return dict(stored["response"])

    async def succeeded(self, response: dict[str, Any]) -> None:
        if self.key is not None:
            await self.store.put_idempotent(
                self.owner, self.key, {"state": "done", "response": response}, self.ttl
            )

    async def failed(self) -> None:
        if self.key is not None:
            await self.store.drop_idempotent(self.owner, self.key)
