"""Stored responses (OpenAI's Responses API) in Redis: each names the session and the version its turn committed.

Records `r:{session}`, a hash: response id -> the stored response (JSON), one per turn the session committed. The
hash lives as long as its session: each write sets its TTL to the session's and drops the records of versions the
session no longer keeps (TXL_KEEP_VERSIONS); each read brings its TTL up to the session's, and finds nothing once
the session is gone.

A response id is `resp_{session id}.{version}`: the session (a router sends a chained request to the replica that
serves it) and the session's version after the turn (one turn commits one version, never reused).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from .plumbing import RedisStore

RESPONSE_ID = re.compile(r"^resp_([A-Za-z0-9_-]{1,64})\.([1-9][0-9]{0,11})$")


def response_id(session_id: str, version: int) -> str:
    return f"resp_{session_id}.{version}"


def parse_response_id(value: str) -> tuple[str, int] | None:
    """(session id, version) of a response id, or None if it is not one."""
    match = RESPONSE_ID.match(value)
    return (match.group(1), int(match.group(2))) if match else None


@dataclass(frozen=True)
class ResponseRecord:
    """A stored response: the response object as answered, the turn's input items, and how its text ended."""

    id: str
    owner: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    messages: bool  # the input was messages, written out with the chat template
    turn_end: bool  # the text ended at the template's turn end: the user's prefix is in memory already

    @property
    def session_id(self) -> str:
        parsed = parse_response_id(self.id)
        assert parsed is not None
        return parsed[0]

    @property
    def version(self) -> int:
        parsed = parse_response_id(self.id)
        assert parsed is not None
        return parsed[1]

    def to_json(self) -> str:
        fields = {k: getattr(self, k) for k in ("owner", "response", "input_items", "messages", "turn_end")}
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, response_id: str, raw: str | bytes) -> ResponseRecord:
        d = json.loads(raw)
        return cls(response_id, d["owner"], d["response"], d["input_items"], d["messages"], d["turn_end"])


@dataclass(frozen=True)
class ResponseWrite:
    """A response record as the script that commits its turn stores it (store/sessions.py's commit), in the same
    step: the response is stored exactly when its turn commits. `oldest`: the oldest version the session keeps
    (older versions' records are dropped)."""

    id: str
    record: str  # JSON (ResponseRecord.to_json)
    oldest: int

    def args(self) -> list[str]:
        return [self.id, self.record, str(self.oldest)]


def no_response_args() -> list[str]:
    """A commit's arguments when it stores no response record."""
    return ["", "", "0"]


class ResponseStore(RedisStore):
    """The response records of every session, in the sessions' Redis (the `store` of its sessions)."""

    def __init__(self, sessions: RedisStore, *, keep_versions: int) -> None:
        super().__init__(sessions.redis, prefix=sessions.prefix)
        self.keep = max(1, keep_versions)
        self._put = self.script("responses", "response_put")
        self._get = self.script("response_get")

    def _keys(self, session_id: str) -> list[str]:
        return [self.keys.responses(session_id), self.keys.session(session_id)]

    def write_of(self, record: ResponseRecord) -> ResponseWrite:
        """The record, for its turn's commit to store (`save` stores it by itself)."""
        return ResponseWrite(record.id, record.to_json(), record.version - self.keep + 1)

    async def save(self, record: ResponseRecord) -> bool:
        """Stores the record for as long as its session lives; False if the session is gone."""
        keys, args = self._keys(record.session_id), self.write_of(record).args()
        return bool(await self.call(lambda: self._put(keys=keys, args=args)))

    async def find(self, owner: str, response_id: str) -> ResponseRecord | None:
        """The owner's stored response; None if there is none (or it is another owner's)."""
        parsed = parse_response_id(response_id)
        if parsed is None:
            return None
        keys = self._keys(parsed[0])
        raw = await self.call(lambda: self._get(keys=keys, args=[response_id]))
        if not raw:
            return None
        record = ResponseRecord.from_json(response_id, raw)
        return record if secrets.compare_digest(record.owner, owner) else None

    async def delete(self, record: ResponseRecord) -> None:
        key = self.keys.responses(record.session_id)
        await self.call(lambda: self.redis.hdel(key, record.id))
