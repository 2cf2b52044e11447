"""A single-writer lease as its holder knows it (leases.py takes and keeps them; the scripts that change a session
check them: a change whose lease is no longer its own is fenced off)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass


@dataclass
class Lease:
    session_id: str
    token: str
    ttl_seconds: float
    released: bool = False  # handed back (by a commit, or at the end of the step)

    @property
    def ttl_ms(self) -> int:
        return max(1, int(self.ttl_seconds * 1000))

    @property
    def op(self) -> str:
        """The id of the step holding it (its token's random part): what its commit records (settling.py)."""
        return self.token.rpartition("/")[2][:16]


def new_token(replica: str) -> str:
    """A lease's token: its holder's replica id (so that a dead replica's leases can be broken at once), and a
    random part."""
    return f"{replica}/{secrets.token_hex(16)}"
