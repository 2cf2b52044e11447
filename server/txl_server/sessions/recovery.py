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

import logging
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from ..errors import Gone, NotFound, Unavailable
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
}


def gone_error(reason: str) -> Gone:
    """The 410 of a session marked gone for `reason`."""
    try:
        lost = Lost(reason)
    except ValueError:  # a reason from a newer server
        lost = Lost.CRASHED
    return Gone(_MESSAGES[lost], param="session_id")


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

    def __init__(self, stores: Stores, *, me: Replica, exclusive: bool) -> None:
        self.store = stores.sessions
        self.heartbeats = stores.heartbeats
        self.leases = stores.leases
        self.me = me
        self.exclusive = exclusive

    async def owned(self, owner: str, session_id: str) -> SessionMeta:
        """The owner's session (a gone one too); NotFound for any other, whether it exists or not."""
        meta = await self.store.get(session_id)
        if meta is None or not secrets.compare_digest(meta.owner, owner):
            raise NotFound(f"no session {session_id!r}", param="session_id")
        return meta

    async def get(self, owner: str, session_id: str) -> SessionMeta:
        """The owner's session, if it can be continued; 410 if its memory is lost."""
        meta = await self.owned(owner, session_id)
        if meta.tier == "gone" or not await self.settle([meta]):
            gone = await self.store.get(session_id)
            raise gone_error(gone.gone if gone is not None else Lost.CRASHED)
        return meta

    async def list_continuable(self, owner: str) -> list[SessionMeta]:
        """The owner's sessions that can be continued: never one whose memory is lost."""
        return await self.settle(await self.store.list(owner))

    async def settle(self, metas: Sequence[SessionMeta]) -> list[SessionMeta]:
        """The sessions of `metas` that can be continued; those whose memory is lost are marked gone on the way.

        Continuable: Redis holds its memory at its version, or its holder is alive (this process: it committed the
        session, and may be placing it in its cache right now)."""
        candidates = [meta for meta in metas if meta.tier != "gone"]
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
