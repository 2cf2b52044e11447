"""Responses (OpenAI's Responses API) on top of session history: a stored response names a session and the
version its turn committed, so that a turn chained to it (`previous_response_id`) feeds only its new input.

A chained turn continues its previous response's session if that response's version is still the session's
newest when the turn takes the session's lease (service.generate's `expected_version`); else (another turn
continued it already, or is continuing it right now) it branches: a fork at that version. A session's state is a
function of its tokens, so either way the turn gives what it would alone. A first turn makes a new session.

Records, in Redis under the server's prefix:
    r:{session}   hash: response id -> the stored response (JSON), one per turn the session committed. The hash
                  lives as long as its session: each write sets its TTL to the session's and drops the records of
                  versions the session no longer keeps (TXL_KEEP_VERSIONS); each read brings its TTL up to the
                  session's, and finds nothing once the session is gone.

A response id is `resp_{session id}.{version}`: the session (a router sends a chained request to the replica that
serves it) and the session's version after the turn (one turn commits one version, never reused).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
from redis.exceptions import RedisError
from txl.sampling import SamplingParams

from ..engine.jobs import ProgressEvent, TokenEvent
from ..errors import Conflict, Gone, InvalidRequest, NotFound, Unavailable
from .service import GenerateOutcome, SessionService
from .store import SessionMeta, SessionStore

log = logging.getLogger(__name__)
T = TypeVar("T")

RESPONSE_ID = re.compile(r"^resp_([A-Za-z0-9_-]{1,64})\.([1-9][0-9]{0,11})$")


def response_id(session_id: str, version: int) -> str:
    return f"resp_{session_id}.{version}"


def parse_response_id(value: str) -> tuple[str, int] | None:
    """(session id, version) of a response id, or None if it is not one."""
    match = RESPONSE_ID.match(value)
    return (match.group(1), int(match.group(2))) if match else None


class PreviousResponseNotFound(InvalidRequest):
    """OpenAI's exact error, which clients look for to fall back to resending the whole conversation."""

    type = "invalid_request_error"

    def __init__(self, response_id: str) -> None:
        shown = response_id if len(response_id) <= 100 else response_id[:100] + "..."
        super().__init__(
            f"Previous response with id {shown!r} not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )


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


_PUT = """
-- KEYS[1] r:{session}, KEYS[2] s:{session}. ARGV: response id, record, the oldest version the session keeps.
-- 0 if the session is gone (nothing written).
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local oldest = tonumber(ARGV[3])
for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    local version = tonumber(string.match(id, '%.(%d+)$'))
    if version and version < oldest then redis.call('HDEL', KEYS[1], id) end
end
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"""

_GET = """
-- KEYS[1] r:{session}, KEYS[2] s:{session}. ARGV: response id. The record while its session exists; the records'
-- TTL is brought up to the session's (a step outside the Responses API may have extended the session's).
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then
    redis.call('DEL', KEYS[1])
    return false
end
local record = redis.call('HGET', KEYS[1], ARGV[1])
if record and ttl > redis.call('PTTL', KEYS[1]) then redis.call('PEXPIRE', KEYS[1], ttl) end
return record
"""


class ResponseStore:
    """The response records of every session, in the sessions' Redis."""

    def __init__(self, sessions: SessionStore, *, keep_versions: int) -> None:
        self.sessions = sessions
        self.redis = sessions.redis
        self.keep = max(1, keep_versions)
        self._put = self.redis.register_script(_PUT)
        self._get = self.redis.register_script(_GET)

    def _keys(self, session_id: str) -> list[str]:
        return [f"{self.sessions.prefix}r:{session_id}", self.sessions._s(session_id)]

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        try:
            return await make()
        except (RedisError, OSError) as exc:
            raise Unavailable("session store (Redis) is unavailable; nothing was changed") from exc

    async def save(self, record: ResponseRecord) -> bool:
        """Stores the record for as long as its session lives; False if the session is gone."""
        oldest = record.version - self.keep + 1
        keys, args = self._keys(record.session_id), [record.id, record.to_json(), str(oldest)]
        return bool(await self._call(lambda: self._put(keys=keys, args=args)))

    async def find(self, owner: str, response_id: str) -> ResponseRecord | None:
        """The owner's stored response; None if there is none (or it is another owner's)."""
        parsed = parse_response_id(response_id)
        if parsed is None:
            return None
        keys = self._keys(parsed[0])
        raw = await self._call(lambda: self._get(keys=keys, args=[response_id]))
        if not raw:
            return None
        record = ResponseRecord.from_json(response_id, raw)
        return record if secrets.compare_digest(record.owner, owner) else None

    async def delete(self, record: ResponseRecord) -> None:
        key = self._keys(record.session_id)[0]
        await self._call(lambda: self.redis.hdel(key, record.id))


# ---------------------------------------------------------------------------------------------- turns


@dataclass(frozen=True)
class Turn:
    """A turn's new input (text and its tokens) and how to reply to it."""

    text: str
    tokens: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    store: bool = True


@dataclass(frozen=True)
class TurnStarted:
    """The session a turn runs on, the version it will commit (naming its response), and how many positions of
    its context were served from memory rather than fed."""

    session_id: str
    version: int
    cached_tokens: int

    @property
    def response_id(self) -> str:
        return response_id(self.session_id, self.version)


_Begun = tuple[AsyncGenerator[Any, None], TurnStarted, Any, str | None]


class ResponseTurns:
    def __init__(self, service: SessionService, store: ResponseStore) -> None:
        self.service = service
        self.store = store

    async def previous(self, owner: str, response_id: str) -> ResponseRecord:
        record = await self.store.find(owner, response_id)
        if record is None:
            raise PreviousResponseNotFound(response_id)
        return record

    async def run(
        self, owner: str, previous: ResponseRecord | None, turn: Turn
    ) -> AsyncGenerator[TurnStarted | TokenEvent | GenerateOutcome, None]:
        """TurnStarted once the turn holds its session (errors before it are the request's), then a TokenEvent
        per token, then the GenerateOutcome (committed). A session this turn made (a first turn's, a branch) is
        deleted if the turn does not commit, or with `store` false."""
        generation, started, first, made = await self._begin(owner, previous, turn)
        committed = False
        try:
            yield started
            item = first
            while item is not None:
                committed = committed or isinstance(item, GenerateOutcome)
                if not isinstance(item, ProgressEvent):
                    yield item
                item = await anext(generation, None)
        finally:
            await generation.aclose()
            if made is not None and not (committed and turn.store):
                await self._discard(owner, made)

    async def _begin(self, owner: str, previous: ResponseRecord | None, turn: Turn) -> _Begun:
        service = self.service
        if previous is None:
            return await self._start(owner, await service.create(owner), turn, cached=0, made=True)
        try:
            meta = await service.get(owner, previous.session_id)
        except NotFound as exc:
            raise PreviousResponseNotFound(previous.id) from exc
        if turn.store and meta.version == previous.version:
            try:
                return await self._start(
                    owner, meta, turn, cached=meta.mem_tokens, expected_version=previous.version
                )
            except Conflict:
                pass  # it moved on, or another turn is continuing it right now: this one branches
            except (NotFound, Gone) as exc:
                raise PreviousResponseNotFound(previous.id) from exc
        try:
            branch = await service.fork(owner, previous.session_id, version=previous.version)
        except (NotFound, Gone) as exc:  # the version is no longer kept, or the session's memory is gone
            raise PreviousResponseNotFound(previous.id) from exc
        return await self._start(owner, branch, turn, cached=branch.mem_tokens, made=True)

    async def _start(
        self,
        owner: str,
        meta: SessionMeta,
        turn: Turn,
        *,
        cached: int,
        expected_version: int | None = None,
        made: bool = False,
    ) -> _Begun:
        """The turn's generation on `meta`'s session, up to its first event (where a moved version shows)."""
        generation = self.service.generate(
            owner,
            meta.id,
            text=turn.text,
            prompt_tokens=turn.tokens,
            max_tokens=turn.max_tokens,
            sampling=turn.sampling,
            stop=turn.stop,
            report_progress=True,
            expected_version=expected_version,
        )
        try:
            first = await anext(generation)
        except BaseException:
            await generation.aclose()
            if made:
                await self._discard(owner, meta.id)
            raise
        started = TurnStarted(meta.id, meta.version + 1, cached)
        return generation, started, first, meta.id if made else None

    async def _discard(self, owner: str, session_id: str) -> None:
        """Deletes a session the turn made, even when the request is being cancelled."""
        with anyio.CancelScope(shield=True):
            try:
                await self.service.delete(owner, session_id)
            except NotFound:
                pass
            except Exception:
                log.warning("could not delete a turn's session; it expires by itself", exc_info=True)
