"""Stored versions: a state as Redis keeps it, the same for a session's versions and a preloaded memory's one.

A version is a header listing its blocks (blocks.py makes and reads it), the ids of the blocks new to the store
(their bytes already written to the block store: sessions/blocks/), and a summary for the versions list;
lua/versions.lua writes it and its blocks' references in one script. The session store and the memory store both
write and read versions this way, so what they send and what they get back is spelled here once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .blocks import StoredVersion
from .plumbing import as_bytes, text

TEXT_TAIL_CHARS = 80  # of the text a step added, kept in the versions list


@dataclass(frozen=True)
class VersionSummary:
    """What the versions list says of one committed step."""

    version: int
    tokens: int  # tokens of the session's text at this version
    created_at: float
    kind: str  # create | append | generate | import | rewind | fork
    text_tail: str | None = None  # the end of the text this step added

    @classmethod
    def of(cls, version: int, tokens: int, created_at: float, kind: str, added: str | None) -> VersionSummary:
        """The summary of a step that added the text `added` (its tail is kept)."""
        return cls(version, tokens, created_at, kind, added[-TEXT_TAIL_CHARS:] if added else None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> VersionSummary:
        return cls(
            int(raw["version"]),
            int(raw["tokens"]),
            float(raw["created_at"]),
            str(raw["kind"]),
            raw.get("text_tail"),
        )


# A version's new blocks must reach Redis within this many seconds of being written to the block store: the
# block store's sweeper collects a block no version lists after BLOCK_GRACE_SECONDS (sessions/blocks/sweeper.py),
# taking it for a crashed writer's; a later version is refused, and writes them again.
MAX_BLOCK_AGE_SECONDS = 20


@dataclass(frozen=True)
class VersionWrite:
    """A version to store: its blocks and header, what the versions list says of it, how many versions to keep,
    and when its new blocks were written to the block store (seconds since the epoch)."""

    stored: StoredVersion
    summary: VersionSummary
    keep: int
    written_at: float
    # A new session's first version ahead of its blocks: the tokens it fed after the (empty) state `stored` holds.
    replay: tuple[int, ...] = ()

    def args(self) -> list[Any]:
        """As the scripts take a version to write: version, summary, header, hidden, keep, written_at, max_age,
        the token ids to feed after the header's state (JSON, or ''), then the ids of the blocks new to the
        store."""
        stored = self.stored
        return [
            str(self.summary.version),
            self.summary.to_json(),
            stored.header_json(),
            stored.hidden or b"",
            max(1, self.keep),
            int(self.written_at),
            MAX_BLOCK_AGE_SECONDS,
            json.dumps(list(self.replay), separators=(",", ":")) if self.replay else "",
            *stored.new_ids,
        ]


@dataclass(frozen=True)
class Replay:
    """A version committed ahead of its blocks (write-behind, sessions/persistence.py): the state of the version
    before it advanced by `tokens`, to `fed` positions fed. Redis writes it naming what the version before it names
    (lua/versions.lua's write_replay); its blocks follow, and settle it (`SessionStore.settle_version`)."""

    summary: VersionSummary
    tokens: tuple[int, ...]
    fed: int
    keep: int
    max_tokens: int  # the most tokens a reader may have to feed again: Redis refuses a longer chain

    def args(self, previous: int) -> list[Any]:
        """As the scripts take it: previous version, version, summary, token ids, fed, keep, max_tokens."""
        return [
            str(previous),
            str(self.summary.version),
            self.summary.to_json(),
            json.dumps(list(self.tokens), separators=(",", ":")),
            self.fed,
            max(1, self.keep),
            self.max_tokens,
        ]


class ReplayRefused(Exception):
    """Redis would not write a version ahead of its blocks ({-7}: the version before it is not kept, or reading it
    back would feed too many tokens again): nothing was written; write it with its blocks."""


@dataclass(frozen=True)
class LoadedVersion:
    """A stored version read back: a header and, in table order, its blocks' bytes where Redis holds them (an older
    server's: b"" for a block whose bytes are in the block store); or what an older server stored whole (one
    safetensors value, `legacy`; or position-keyed blocks, `legacy_blocks`)."""

    version: int
    header: dict[str, Any] | None
    hidden: bytes | None
    blocks: list[bytes]
    legacy: bytes | None
    legacy_blocks: dict[int, bytes]
    # A version committed ahead of its blocks: the token ids to feed after the state `header` holds.
    replay: tuple[int, ...] = ()


class BlocksMissing(Exception):
    """A version lists blocks the store does not hold (they expired), or its new blocks were written too long ago
    (`ids` empty): write them (or read elsewhere)."""

    def __init__(self, ids: set[str]) -> None:
        super().__init__(f"{len(ids)} stored blocks are gone" if ids else "the new blocks are too old")
        self.ids = ids


def check_written(reply: Any) -> None:
    """Raises BlocksMissing if a script writing a version refused it ({-3, id}, {-6}), ReplayRefused if it would
    not write it ahead of its blocks ({-7}): nothing was written."""
    if int(reply[0]) == -7:
        raise ReplayRefused()
    if int(reply[0]) == -3:
        raise BlocksMissing({text(reply[1])})
    if int(reply[0]) == -6:
        raise BlocksMissing(set())


def load_status(reply: Any) -> int:
    """The status of lua/load_version.lua's reply (1: a version, 0: none in this format, -1: not that version);
    raises BlocksMissing if a block the version lists is gone."""
    status = int(reply[0])
    if status == -2:
        raise BlocksMissing({text(reply[1])})
    return status


def loaded(reply: Any) -> LoadedVersion:
    """The version in a reply of status 1."""
    header = json.loads(reply[2])
    hidden = as_bytes(reply[3]) or None
    replay = tuple(int(t) for t in json.loads(text(reply[4]))) if as_bytes(reply[4]) else ()
    blocks = [as_bytes(b) for b in reply[5:]]
    return LoadedVersion(int(text(reply[1])), header, hidden, blocks, None, {}, replay)
