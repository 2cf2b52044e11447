"""Background responses' jobs in Redis: any replica answers a poll, a cancel or a stream resumed after an event.

`b:{response id}`, a hash: the owner, the job's status, the response object as it stands (JSON), the replica
running it (`holder`, "{name}#{incarnation}": a job whose holder is no longer alive was interrupted), and `cancel`
once a cancel is asked for. `be:{response id}`, a list: the job's stream events (JSON, numbered from 0). Both are
kept for `RETENTION_SECONDS` after the last write (OpenAI keeps a background response about ten minutes without
`store`; with `store`, the stored response outlives its job: store/responses.py).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from .plumbing import RedisStore, field_args, text
from .sessions import SessionStore

RETENTION_SECONDS = 600
TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})


@dataclass(frozen=True)
class Job:
    response_id: str
    owner: str
    status: str
    response: dict[str, Any]
    holder: str
    cancel: bool = False

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class JobStore(RedisStore):
    def __init__(self, sessions: SessionStore, *, retention_seconds: float = RETENTION_SECONDS) -> None:
        super().__init__(sessions.redis, prefix=sessions.prefix)
        self.retention_ms = max(1, int(retention_seconds * 1000))
        self._write = self.script("job_write")

    def _keys(self, response_id: str) -> list[str]:
        return [self.keys.job(response_id), self.keys.job_events(response_id)]

    async def write(
        self,
        response_id: str,
        *,
        response: dict[str, Any] | None = None,
        events: list[dict[str, Any]] | None = None,
        **fields: str,
    ) -> None:
        """Sets the job's fields (its status and response object from `response`) and appends `events`."""
        if response is not None:
            fields = {**fields, "status": str(response["status"]), "response": _json(response)}
        args = [self.retention_ms, *field_args(fields), *(_json(e) for e in events or [])]
        keys = self._keys(response_id)
        await self.call(lambda: self._write(keys=keys, args=args))

    async def find(self, owner: str, response_id: str) -> Job | None:
        """The owner's job; None if there is none (or it is another owner's)."""
        key = self.keys.job(response_id)
        raw = {text(k): text(v) for k, v in (await self.call(lambda: self.redis.hgetall(key))).items()}
        if not raw or not secrets.compare_digest(raw.get("owner", ""), owner):
            return None
        return Job(
            response_id,
            raw["owner"],
            raw["status"],
            json.loads(raw["response"]),
            raw["holder"],
            "cancel" in raw,
        )

    async def events(self, response_id: str, start: int) -> list[dict[str, Any]]:
        """The job's events from index `start` (its sequence number) on."""
        key = self.keys.job_events(response_id)
        return [json.loads(text(e)) for e in await self.call(lambda: self.redis.lrange(key, start, -1))]

    async def count(self, response_id: str) -> int:
        """How many events the job has (the next one's sequence number)."""
        key = self.keys.job_events(response_id)
        return int(await self.call(lambda: self.redis.llen(key)))

    async def delete(self, response_id: str) -> None:
        keys = self._keys(response_id)
        await self.call(lambda: self.redis.delete(*keys))

    async def ask_cancel(self, response_id: str) -> None:
        await self.write(response_id, cancel="1")
