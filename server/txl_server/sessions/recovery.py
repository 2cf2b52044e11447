"""The server never lists a session it cannot step.

A session's metadata is in Redis; its memory at the committed version is in Redis too (persistence `always`, or
a session evicted or saved at shutdown), or only in the process of the replica that committed it (its
`holder`, persistence `evict` or `none`). A session can be continued if Redis holds its memory at its version,
or its holder is alive. Otherwise its memory is lost: the session is marked gone (`SessionStore.mark_gone`) with
the reason, drops out of its owner's list, and answers `410` saying what happened.

Who is alive: each replica renews a heartbeat (store/heartbeats.py); a replica restarted after `kill -9` replaces
its earlier incarnation at once. A server with a private Redis is the only one using it: every other holder is
dead.

This is checked at start-up for every session (`reconcile`), when an owner lists sessions or reads one
(`settle`), and when a step finds no memory (`missing`).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from ..errors import Gone, NotFound, Unavailable
from .acked import AckedVersions
from .observer import SessionObserver
from .store.sessions import SessionMeta
from .store.stores import Stores

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0  # a replica renews its heartbeat this often
HEARTBEAT_TTL_SECONDS = 15.0  # and is taken for dead this long after its last one


class Lost(StrEnum):
    """Why a session's memory was lost (the `gone` field of a session marked gone)."""

    EVICTED = "evicted"  # persistence none: pushed out of the host tier to make room
    RESTARTED = "restarted"  # persistence none: its server shut down
    UNSAVED = "unsaved"  # its server shut down gracefully but ran out of grace period before saving it
    CRASHED = "crashed"  # the process holding it stopped without saving it (killed, crashed)
    # The session store lost what it held (acked.py): Redis came back holding an older version than was
    # acknowledged, or without the session at all. The values are the 410s' codes.
    STEPS_LOST = "store_lost_steps"
    SESSION_LOST = "store_lost_session"


_MESSAGES = {
    Lost.EVICTED: "this session's memory was dropped to make room for more recently used sessions, and the "
    "server keeps memory only in its own process (persistence 'none'); create a new session",
    Lost.RESTARTED: "this session's memory was lost when its server shut down: with persistence 'none' memory "
    "is kept only in the server process (TXL_PERSISTENCE=always keeps sessions across restarts); create a new "
    "session",
    Lost.UNSAVED: "this session's memory was lost: its server shut down before it could save it to Redis (the "
    "shutdown grace period, TXL_SHUTDOWN_GRACE_SECONDS, ran out); create a new session",
    Lost.CRASHED: "this session's memory was lost: the server process that held it stopped without saving it "
    "(killed or crashed; persistence 'evict' writes memory to Redis only on eviction or a graceful shutdown, "
    "'always' at every step); create a new session",
    Lost.STEPS_LOST: "the session store (Redis) lost this session's latest steps: it came back holding an older "
    "version than the server acknowledged (restarted from an older snapshot, or failed over to a replica that "
    "had not caught up). The session is not continued from there, which would give its lost version numbers to "
    "other text; create a new session (its earlier text is in its versions list)",
    Lost.SESSION_LOST: "the session store (Redis) lost this session: it came back without it (restarted empty, "
    "or evicted it under memory pressure); create a new session",
}


def gone_error(reason: str) -> Gone:
    """The 410 of a session marked gone for `reason`."""
    try:
        lost = Lost(reason)
    except ValueError:  # a reason from a newer server
        lost = Lost.CRASHED
    code = lost.value if lost in (Lost.STEPS_LOST, Lost.SESSION_LOST) else None
    return Gone(_MESSAGES[lost], param="session_id", code=code)


def held_elsewhere() -> Unavailable:
    return Unavailable(
        "this session's memory is held by another server process sharing this Redis (persistence 'evict' or "
        "'none' keeps it in that process until it evicts the session or shuts down): send the request to that "
        "server, or run every replica with TXL_PERSISTENCE=always; nothing was changed",
        param="session_id",
    )


@dataclass(frozen=True)
class Replica:
    name: str  # host:port: no two live processes share it
    incarnation: str  # this process start

    @property
    def id(self) -> str:
        return f"{self.name}#{self.incarnation}"

    @classmethod
    def new(cls, port: int) -> Replica:
        return cls(f"{socket.gethostname()}:{port}", secrets.token_hex(6))


@dataclass(frozen=True)
class Reconciled:
    kept: int  # sessions that can be continued
    lost: int  # marked gone now
    gone: int  # marked gone before
    leases_broken: int  # leases of dead replicas, freed without waiting for their TTL


class Recovery:
    """What this replica (`me`) knows of the sessions in Redis: which it can continue. `exclusive`: no other
    replica uses this Redis."""

    def __init__(
        self,
        stores: Stores,
        *,
        me: Replica,
        exclusive: bool,
        acked: AckedVersions | None = None,
        observer: SessionObserver | None = None,
    ) -> None:
        self.store = stores.sessions
        self.heartbeats = stores.heartbeats
        self.leases = stores.leases
        self.me = me
        self.exclusive = exclusive
        self.acked = acked if acked is not None else AckedVersions()
        self.observer = observer or SessionObserver()

    async def owned(self, owner: str, session_id: str) -> SessionMeta:
        """The owner's session (a gone one too); NotFound for any other, whether it exists or not (410 for one
        this process acknowledged that Redis lost)."""
        meta = await self.store.get(session_id)
        if meta is None or not secrets.compare_digest(meta.owner, owner):
            raise await self.not_found(owner, session_id)
        return meta

    async def get(self, owner: str, session_id: str) -> SessionMeta:
        """The owner's session, if it can be continued; 410 if its memory is lost."""
        meta = await self.owned(owner, session_id)
        if meta.tier != "gone":
            await self.check_acked(meta)
        if meta.tier == "gone" or not await self.settle([meta]):
            gone = await self.store.get(session_id)
            raise gone_error(gone.gone if gone is not None else Lost.CRASHED)
        return meta

    async def not_found(self, owner: str, session_id: str) -> NotFound | Gone:
        """The error for a session Redis does not hold for `owner`: 404, unless this process acknowledged it and
        it cannot have expired or been deleted since (Redis lost it: 410, and marked so for every replica)."""
        known = self.acked.lost(session_id)
        if known is None or not secrets.compare_digest(known.owner, owner):
            return NotFound(f"no session {session_id!r}", param="session_id")
        if await self.store.was_deleted(session_id):
            self.acked.forget(session_id)
            return NotFound(f"no session {session_id!r}", param="session_id")
        self._report_loss(known, None)
        await self.store.mark_lost(known, Lost.SESSION_LOST)
        return gone_error(Lost.SESSION_LOST)

    async def check_acked(self, meta: SessionMeta) -> None:
        """Raises 410 (`store_lost_steps`) if Redis holds `meta`'s session at an older version than this process
        acknowledged, marking it gone for every replica: its lost version numbers are never given again."""
        known = self.acked.behind(meta)
        if known is None:
            return
        self._report_loss(known, meta.version)
        await self.store.mark_gone(meta, Lost.STEPS_LOST)
        raise gone_error(Lost.STEPS_LOST)

    def _report_loss(self, known: SessionMeta, held: int | None) -> None:
        what = "without it" if held is None else f"holding version {held}"
        log.error(
            "the session store (Redis) lost acknowledged steps: session %s… was acknowledged at version %d but "
            "Redis came back %s (restarted from an older snapshot or empty, lost the end of its append-only file, "
            "evicted it, or failed over to a replica that had not caught up); it now answers 410",
            known.id[:8],
            known.version,
            what,
        )
        self.observer.on_store_loss("session" if held is None else "steps")
        self.acked.forget(known.id)

    async def list_continuable(self, owner: str) -> list[SessionMeta]:
        """The owner's sessions that can be continued: never one whose memory is lost."""
        return await self.settle(await self.store.list(owner))

    async def settle(self, metas: Sequence[SessionMeta]) -> list[SessionMeta]:
        """The sessions of `metas` that can be continued; those whose memory is lost are marked gone on the way.

        Continuable: Redis holds its memory at its version, or its holder is alive (this process: it committed the
        session, and may be placing it in its cache right now)."""
        candidates = []
        for meta in metas:
            if meta.tier == "gone":
                continue
            if self.acked.behind(meta) is not None:
                with contextlib.suppress(Gone):
                    await self.check_acked(meta)
                continue
            candidates.append(meta)
        stored = await self.store.newest_stored([meta.id for meta in candidates])
        unstored = [meta for meta in candidates if stored.get(meta.id) != meta.version]
        others = [meta.holder for meta in unstored if meta.holder and meta.holder != self.me.id]
        live = await self._live(others)
        lost = set()
        for meta in unstored:
            if meta.holder not in live and await self.store.mark_gone(meta, Lost.CRASHED):
                lost.add(meta.id)
        return [meta for meta in candidates if meta.id not in lost]

    async def missing(self, meta: SessionMeta) -> Gone | Unavailable:
        """Why a session's memory at its version is neither in this process nor in Redis."""
        elsewhere = meta.holder and meta.holder != self.me.id and not self.exclusive
        if elsewhere and meta.holder in await self.heartbeats.live([meta.holder]):
            return held_elsewhere()
        if meta.holder != self.me.id:  # this process never had it: its holder died without saving it
            await self.store.mark_gone(meta, Lost.CRASHED)
        return gone_error(Lost.CRASHED)

    async def reconcile(self) -> Reconciled:
        """At start-up (after this replica's first heartbeat): every session checked as `settle` does, and the
        leases of dead replicas (a step cut by `kill -9`) freed at once."""
        kept = lost = gone = 0
        async for batch in self.store.scan():
            gone += sum(1 for meta in batch if meta.tier == "gone")
            continuable = await self.settle(batch)
            kept += len(continuable)
            lost += len(batch) - len(continuable) - sum(1 for meta in batch if meta.tier == "gone")
        leases = [(session_id, token) async for session_id, token in self.leases.held()]
        holders = {token.rpartition("/")[0] for _, token in leases} - {""}  # "": a server before holders
        live = await self._live(sorted(holders))
        broken = 0
        for session_id, token in leases:
            holder = token.rpartition("/")[0]
            if holder and holder not in live and await self.leases.break_lease(session_id, token):
                broken += 1
        return Reconciled(kept=kept, lost=lost, gone=gone, leases_broken=broken)

    async def _live(self, holders: Sequence[str]) -> set[str]:
        """Which of `holders` are alive: this replica, and those with a live heartbeat (none but this one with a
        private Redis)."""
        return {self.me.id} | (set() if self.exclusive else await self.heartbeats.live(holders))
