"""A change whose reply was lost, settled: the client is told what happened, never "nothing was changed" by guess.

When Redis does not answer a change that was sent (store/failures.py: OutcomeUnknown), the step asks Redis, once
it answers again, whether the change was applied (lua/settle_step.lua: each commit records its step's id among the
session's last few), and in the same script fences it off if it was not: every change needs its step's lease (a
create, the lease its new session's id was reserved with), which the settling hands back. So the answer given
stays true even if the lost change reaches Redis later.

Waiting is bounded: past the step's lease TTL since the change was sent, Redis would refuse a late arrival by
itself (its lease has expired, by Redis's own clock), so a client still without an answer then gets
`OutcomeUnknown` saying how to find out, and a retry with its Idempotency-Key is answered from the change's own
record (written by the same script) or runs anew, never twice.
"""

from __future__ import annotations

import asyncio
import time

from ..errors import OutcomeUnknown, Unavailable
from .store.lease import Lease
from .store.sessions import SessionStore

SETTLE_POLL_SECONDS = 0.25


async def settled(
    store: SessionStore,
    session_id: str,
    *,
    kind: str,
    lease: Lease,
    sent_at: float,
    wait_seconds: float,
    version: int = 0,
) -> int:
    """The version the change of the step holding `lease` made (0 for a deletion; `kind`: "commit" for a commit
    or a create, "delete"), once Redis says it was applied. Raises Unavailable ("nothing was changed") once Redis
    says it was not (it is then fenced off), and OutcomeUnknown if Redis does not answer within `wait_seconds` of
    `sent_at` (time.monotonic()). `version`: the session's version before a commit (0: a create)."""
    what = _what(kind, version)
    deadline = sent_at + wait_seconds
    while True:
        try:
            # Asked only once Redis answers a PING: it has then run what was waiting for it since it stopped
            # answering (the lost change among it), so that a change Redis did receive is found applied rather
            # than fenced off by a settling that overtook it.
            if not await store.ping():
                raise Unavailable("Redis does not answer")
            applied = await store.settle(session_id, kind=kind, lease=lease)
        except Unavailable:
            if time.monotonic() >= deadline:
                raise unknown(what, session_id, kind, version, time.monotonic() - sent_at) from None
            await asyncio.sleep(SETTLE_POLL_SECONDS)
            continue
        if applied is None:
            raise Unavailable(
                f"the session store (Redis) did not answer while {what} was committed; once it answered again, "
                f"{what} was found not applied: nothing was changed"
            )
        return applied


def _what(kind: str, version: int) -> str:
    if kind == "delete":
        return "this deletion"
    return "this step" if version else "this session's creation"


def unknown(what: str, session_id: str, kind: str, version: int, waited: float) -> OutcomeUnknown:
    if kind == "delete":
        how = f"read the session (GET /v1/sessions/{session_id}): 404 means it was deleted"
    elif version:
        how = f"read the session (GET /v1/sessions/{session_id}): version {version + 1} means it was applied"
    else:
        how = f"read the session (GET /v1/sessions/{session_id}): 404 means it was not created"
    return OutcomeUnknown(
        f"the session store (Redis) has not answered for {waited:.0f} s since {what} was sent to it: it may or may "
        f"not have been applied. A retry with the same Idempotency-Key gets its result once Redis answers; or {how}"
    )
