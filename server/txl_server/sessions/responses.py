"""Responses (OpenAI's Responses API) on top of session history: a stored response names a session and the
version its turn committed, so that a turn chained to it (`previous_response_id`) feeds only its new input.

A chained turn continues its previous response's session if that response's version is still the session's
newest when the turn takes the session's lease (service.generate's `expected_version`); else (another turn
continued it already, or is continuing it right now) it branches: a fork at that version. A session's state is a
function of its tokens, so either way the turn gives what it would alone. A first turn makes a new session.

The stored responses, each naming the session and the version its turn committed, are in Redis
(store/responses.py). "Turn" here is a conversation's turn, nothing else.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from txl.sampling import SamplingParams

from ..admission.classes import RequestClass
from ..engine.jobs import ProgressEvent, TokenEvent
from ..errors import Conflict, Gone, InvalidRequest, NotFound
from .service import GenerateOutcome, SessionService
from .store.leases import ResponseNotHeld
from .store.responses import ResponseRecord, ResponseStore, ResponseWrite, response_id

# ResponseRecord too: the API reads stored responses through this service, never through their store.
__all__ = [
    "ContextTooLong",
    "PreviousResponseNotFound",
    "ResponseRecord",
    "ResponseTurns",
    "Turn",
    "TurnPlace",
    "TurnStarted",
]
from .store.sessions import SessionMeta

log = logging.getLogger(__name__)


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


@dataclass(frozen=True, kw_only=True)
class Turn:
    """A turn's new input (text and its tokens) and how to reply to it. With `window`, the turn's whole context
    (what the session read, this input and the reply) must fit the memory's window (truncation "disabled")."""

    text: str
    tokens: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    store: bool = True
    top_logprobs: int = 0
    window: bool = False
    klass: RequestClass | None = None  # its request's class (admission.classes)


@dataclass(frozen=True, kw_only=True)
class TurnStarted:
    """The session a turn runs on, the version it will commit (naming its response), how many positions of its
    context were served from memory (a session's, or the prefix cache's) rather than fed, and how many of its
    input tokens were fed."""

    session_id: str
    version: int
    cached_tokens: int
    fed_tokens: int

    @property
    def response_id(self) -> str:
        return response_id(self.session_id, self.version)


@dataclass(frozen=True)
class TurnPlace:
    """Where a turn runs: a session as it was found, the positions of context it serves, the version the turn
    expects to find (None: whatever it finds), whether it was made for the turn (deleted if the turn does not
    commit, or with `store` false), and whether it read the turn's input already (a first turn's, through the
    prefix cache)."""

    meta: SessionMeta
    cached: int
    expected_version: int | None = None
    made: bool = False
    prompted: bool = False

    @property
    def response_id(self) -> str:
        return response_id(self.meta.id, self.meta.version + 1)


class ContextTooLong(InvalidRequest):
    def __init__(self, needed: int, window: int) -> None:
        super().__init__(
            f"this turn's context ({needed} positions with its reply) would outgrow the memory's window of "
            f"{window} positions, and truncation is 'disabled'; send truncation 'auto' to let the window slide",
            param="truncation",
            code="context_length_exceeded",
        )


# A turn begun: its generation, its start, its first event, the session it made (if any), and the response
# record its commit is to store (once made).
_Begun = tuple[AsyncGenerator[Any, None], TurnStarted, Any, str | None, list[ResponseRecord]]
# The record of a turn's response, made of its outcome as the turn commits (stored by that commit).
RecordOf = Callable[[GenerateOutcome], ResponseRecord | None]


# The response records this process stored lately, kept so that a turn chained to one need not read it first:
# this many, each at most KNOWN_BYTES of JSON (a longer one is read when continued).
KNOWN_RESPONSES = 1024
KNOWN_BYTES = 16 * 1024


class ResponseTurns:
    """Turns on top of sessions. A chained turn's previous response, when this process stored it, is taken from
    memory (`_known`), not read: whether Redis still holds it is checked by the step's lease script, in the round
    trip the step makes anyway (leases.py's `holding_response`); a path that takes no such step reads it first
    (`_read`). Records never change once stored, so a known one is the stored one while Redis holds it."""

    def __init__(self, service: SessionService, store: ResponseStore) -> None:
        self.service = service
        self.store = store
        self._known: OrderedDict[str, ResponseRecord] = OrderedDict()

    async def find(self, owner: str, response_id: str) -> ResponseRecord | None:
        """The owner's stored response, while its session keeps the version it names."""
        return await self.store.find(owner, response_id)

    async def save(self, record: ResponseRecord) -> None:
        """Stores a finished response, so that it can be retrieved and continued."""
        if await self.store.save(record) and len(record.to_json()) <= KNOWN_BYTES:
            self._note(record)

    async def forget(self, record: ResponseRecord) -> None:
        """Forgets a stored response (its session stays)."""
        self._known.pop(record.id, None)
        await self.store.delete(record)

    async def previous(self, owner: str, response_id: str) -> ResponseRecord:
        """The owner's stored response a turn continues: one this process stored (unread: see the class), or
        read; PreviousResponseNotFound if there is none."""
        known = self._known.get(response_id)
        if known is not None and secrets.compare_digest(known.owner, owner):
            return known
        record = await self.store.find(owner, response_id)
        if record is None:
            raise PreviousResponseNotFound(response_id)
        return record

    def _note(self, record: ResponseRecord) -> None:
        self._known[record.id] = record
        self._known.move_to_end(record.id)
        while len(self._known) > KNOWN_RESPONSES:
            self._known.popitem(last=False)

    def _unread(self, record: ResponseRecord) -> bool:
        """Whether `record` came from memory (`previous`), not from Redis."""
        return self._known.get(record.id) is record

    async def _read(self, owner: str, record: ResponseRecord) -> ResponseRecord:
        """`record` as Redis holds it now (a path whose step does not check it): PreviousResponseNotFound if gone."""
        if not self._unread(record):
            return record
        self._known.pop(record.id, None)
        return await self.previous(owner, record.id)

    async def run(
        self, owner: str, previous: ResponseRecord | None, turn: Turn, record: RecordOf | None = None
    ) -> AsyncGenerator[TurnStarted | TokenEvent | GenerateOutcome, None]:
        """TurnStarted once the turn holds its session (errors before it are the request's), then a TokenEvent
        per token, then the GenerateOutcome (committed). A first turn reads its input through the prefix cache
        into a new session; a chained one continues its previous response's session, or branches. A session
        this turn made is deleted if the turn does not commit, or with `store` false. `record`: the response's
        record of the outcome, stored by the commit itself (no `save` after it)."""
        async for item in self._drive(owner, turn, await self._begin(owner, previous, turn, record)):
            yield item

    async def run_at(
        self, owner: str, place: TurnPlace, turn: Turn, record: RecordOf | None = None
    ) -> AsyncGenerator[TurnStarted | TokenEvent | GenerateOutcome, None]:
        """As `run`, on a session chosen beforehand (`place`): a conversation's, or a background turn's."""
        async for item in self._drive(owner, turn, await self._start(owner, place, turn, record)):
            yield item

    async def place(self, owner: str, previous: ResponseRecord | None) -> TurnPlace:
        """A session for a turn whose response id must be known before it runs (a background turn): a new one,
        or a branch of the previous response's (a fork at its version: its blocks shared), which nothing else
        knows of yet, so the turn commits the version after it whenever it runs."""
        service = self.service
        if previous is None:
            return TurnPlace(await service.create(owner), 0, made=True)
        previous = await self._read(owner, previous)
        try:
            branch = await service.fork(owner, previous.session_id, version=previous.version)
        except (NotFound, Gone) as exc:
            raise PreviousResponseNotFound(previous.id) from exc
        return TurnPlace(branch, branch.mem_tokens, made=True)

    async def _drive(
        self, owner: str, turn: Turn, begun: _Begun
    ) -> AsyncGenerator[TurnStarted | TokenEvent | GenerateOutcome, None]:
        generation, started, first, made, stored = begun
        committed = False
        try:
            yield started
            item = first
            while item is not None:
                if isinstance(item, GenerateOutcome):
                    committed = True
                    for record in stored:  # in Redis now: known from here on
                        self._note(record)
                if not isinstance(item, ProgressEvent):
                    yield item
                item = await anext(generation, None)
        finally:
            await generation.aclose()
            if made is not None and not (committed and turn.store):
                await self._discard(owner, made)

    async def _begin(
        self, owner: str, previous: ResponseRecord | None, turn: Turn, record: RecordOf | None
    ) -> _Begun:
        service = self.service
        if previous is None:
            meta, cached = await service.create_reading(owner, turn.text, turn.tokens, turn.klass)
            return await self._start(owner, TurnPlace(meta, cached, made=True, prompted=True), turn, record)
        # A conversation's session moves only with its conversation: a response of it is continued on a branch.
        if turn.store and not previous.response.get("conversation"):
            holding = previous.id if self._unread(previous) else None  # checked by the step: see the class
            try:  # on its session, if the step finds it still at the response's version (read under its lease)
                return await self._open(owner, previous.session_id, previous.version, turn, record, holding)
            except Conflict:
                pass  # it moved on, or another turn is continuing it right now: this one branches
            except (NotFound, Gone, ResponseNotHeld) as exc:
                self._known.pop(previous.id, None)
                raise PreviousResponseNotFound(previous.id) from exc
        previous = await self._read(owner, previous)
        try:
            branch = await service.fork(owner, previous.session_id, version=previous.version)
        except (NotFound, Gone) as exc:  # the version is no longer kept, or the session's memory is gone
            raise PreviousResponseNotFound(previous.id) from exc
        return await self._start(owner, TurnPlace(branch, branch.mem_tokens, made=True), turn, record)

    async def _start(self, owner: str, place: TurnPlace, turn: Turn, record: RecordOf | None) -> _Begun:
        """The turn's generation on `place`'s session, up to its first event (where a moved version shows)."""
        meta = place.meta
        try:
            begun = await self._open(
                owner, meta.id, place.expected_version, turn, record, prompted=place.prompted
            )
        except BaseException:
            if place.made:
                await self._discard(owner, meta.id)
            raise
        generation, started, first, _, stored = begun
        if place.prompted:
            started = dataclasses.replace(
                started, cached_tokens=place.cached, fed_tokens=len(turn.tokens) - place.cached
            )
        else:
            started = dataclasses.replace(started, cached_tokens=place.cached)
        return generation, started, first, meta.id if place.made else None, stored

    async def _open(
        self,
        owner: str,
        session_id: str,
        expected_version: int | None,
        turn: Turn,
        record: RecordOf | None,
        holding_response: str | None = None,
        *,
        prompted: bool = False,
    ) -> _Begun:
        """The turn's generation on the session, up to its first event, with what the step found (its version,
        the positions its memory serves) read under the step's lease: nothing is read before it."""
        fed = [] if prompted else turn.tokens
        held: list[SessionMeta] = []
        stored: list[ResponseRecord] = []

        def write(outcome: GenerateOutcome) -> ResponseWrite | None:
            made = record(outcome) if record is not None else None
            if made is None:
                return None
            written = self.store.write_of(made)
            if len(written.record) <= KNOWN_BYTES:
                stored.append(made)
            return written

        def check(meta: SessionMeta) -> None:
            needed = meta.tokens + 1 + len(fed) + turn.max_tokens  # the start token's position too
            if turn.window and needed > meta.mem_len:
                raise ContextTooLong(needed, meta.mem_len)
            held.append(meta)

        generation = self.service.generate(
            owner,
            session_id,
            text="" if prompted else turn.text,
            prompt_tokens=fed,
            max_tokens=turn.max_tokens,
            sampling=turn.sampling,
            stop=turn.stop,
            top_logprobs=turn.top_logprobs,
            klass=turn.klass,
            report_progress=True,
            expected_version=expected_version,
            on_held=check,
            response=write if record is not None else None,
            holding_response=holding_response,
        )
        try:
            first = await anext(generation)
        except BaseException:
            await generation.aclose()
            raise
        meta = held[0]
        started = TurnStarted(
            session_id=meta.id, version=meta.version + 1, cached_tokens=meta.mem_tokens, fed_tokens=len(fed)
        )
        return generation, started, first, None, stored

    async def _discard(self, owner: str, session_id: str) -> None:
        """Deletes a session the turn made, even when the request is being cancelled."""
        with anyio.CancelScope(shield=True):
            try:
                await self.service.delete(owner, session_id)
            except NotFound:
                pass
            except Exception:
                log.warning("could not delete a turn's session; it expires by itself", exc_info=True)
