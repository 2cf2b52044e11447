"""The server never lists a session it cannot step.

A session's metadata is in Redis; its memory at the committed version is in Redis too (persistence `always`, or
a session evicted or saved at shutdown), or only in the process of the replica that committed it (its
`holder`, persistence `evict` or `none`). A session can be continued if Redis holds its memory at its version,
or its holder is alive. Otherwise its memory is lost: the session is marked gone (`SessionStore.mark_gone`) with
the reason, drops out of its owner's list, and answers `410` saying what happened.

Who is alive: each replica renews a heartbeat key `r:{name}` holding its incarnation (a random id per process
start), with a TTL. A replica's name is its host and port, which two live processes cannot share: a replica
restarted after `kill -9` overwrites its own heartbeat, so its earlier incarnation is dead at once, not after the
TTL. A server with a private Redis is the only one using it: every other holder is dead.

This is checked at start-up for every session (`reconcile`), when an owner lists sessions or reads one
(`settle`), and when a step finds no memory.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from ..errors import Gone, Unavailable
from .store import SessionMeta, SessionStore

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


async def settle(
    store: SessionStore, metas: Sequence[SessionMeta], *, me: Replica, exclusive: bool
) -> list[SessionMeta]:
    """The sessions of `metas` that can be continued; those whose memory is lost are marked gone on the way.

    Continuable: Redis holds its memory at its version, or its holder is alive (this process: it committed the
    session, and may be placing it in its cache right now). `exclusive`: no other replica uses this Redis."""
    candidates = [meta for meta in metas if meta.tier != "gone"]
    stored = await store.memory_versions([meta.id for meta in candidates])
    unstored = [meta for meta in candidates if stored.get(meta.id) != meta.version]
    others = [meta.holder for meta in unstored if meta.holder and meta.holder != me.id]
    live = {me.id} | (set() if exclusive else await store.live_replicas(others))
    lost = set()
    for meta in unstored:
        if meta.holder not in live and await store.mark_gone(meta, Lost.CRASHED):
            lost.add(meta.id)
    return [meta for meta in candidates if meta.id not in lost]


@dataclass(frozen=True)
class Reconciled:
    kept: int  # sessions that can be continued
    lost: int  # marked gone now
    gone: int  # marked gone before
    leases_broken: int  # leases of dead replicas, freed without waiting for their TTL


async def reconcile(store: SessionStore, *, me: Replica, exclusive: bool) -> Reconciled:
    """At start-up (after this replica's first heartbeat): every session checked as `settle` does, and the
    leases of dead replicas (a step cut by `kill -9`) freed at once."""
    kept = lost = gone = 0
    async for batch in store.scan():
        gone += sum(1 for meta in batch if meta.tier == "gone")
        continuable = await settle(store, batch, me=me, exclusive=exclusive)
        kept += len(continuable)
        lost += len(batch) - len(continuable) - sum(1 for meta in batch if meta.tier == "gone")
    leases = [(session_id, token) async for session_id, token in store.leases()]
    holders = {token.rpartition("/")[0] for _, token in leases} - {""}  # "": a server before holders
    live = {me.id} | (set() if exclusive else await store.live_replicas(sorted(holders)))
    broken = 0
    for session_id, token in leases:
        holder = token.rpartition("/")[0]
        if holder and holder not in live and await store.break_lease(session_id, token):
            broken += 1
    return Reconciled(kept=kept, lost=lost, gone=gone, leases_broken=broken)
