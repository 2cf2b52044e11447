"""The in-process state cache: session id -> model state, in tiers with byte budgets.

    device  the model's device, up to `device_budget` bytes (where steps run)
    host    the host's RAM, up to `host_budget` bytes (least recently used sessions move here)
    beyond  placement writes them to Redis (persistence on) or drops them (the session is then "gone")

Bytes are counted exactly: the pool blocks each state keeps alive, with blocks shared by several sessions (a
fork shares its parent's past; sessions started from a preloaded memory share its blocks) or versions counted once
per tier, and so are last hidden states shared by several entries. Besides its newest state, an entry on the device
may keep its session's older versions (rewind, forks at a version): they are the first to go when room is needed.
The cache only does bookkeeping and picks victims; placement.py moves tensors (off the event loop) and talks to
Redis.

The cache holds every state it keeps (its own hold, `ModelState.retain`: whoever gave it one keeps theirs) and
releases it when the state leaves: replaced by the next version, dropped, evicted, or older versions let go. Its
blocks go back to the pool then, unless a running job holds them too.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ..engine.state import ModelState
from .store.versions import VersionSummary

DEVICE, HOST = "device", "host"


@dataclass
class Entry:
    state: ModelState
    version: int
    tier: str
    older: dict[int, ModelState] = field(default_factory=dict)  # version -> state, kept on the device only
    summaries: list[VersionSummary] = field(default_factory=list)  # the kept versions, oldest first

    def states(self) -> list[ModelState]:
        return [self.state, *self.older.values()]

    def release(self) -> None:
        """The cache's holds on its states go (it left the cache)."""
        for state in self.states():
            state.release()


@dataclass
class TierUsage:
    budget: int
    # (pool, block id) -> number of entries holding that block: a block shared by several sessions (a fork
    # shares its parent's past) is counted once.
    blocks: dict[tuple[int, int], int] = field(default_factory=dict)
    block_bytes: int = 0  # bytes of the distinct blocks held
    # Last hidden states (outside the pool), by their storage: a state shared by several entries (a session
    # started from a preloaded memory, or forked, before its first step) is counted once too.
    hidden: dict[tuple[str, int], int] = field(default_factory=dict)
    extra: int = 0  # bytes of the distinct hidden states held

    @property
    def used(self) -> int:
        return self.block_bytes + self.extra

    def add(self, state: ModelState) -> None:
        pool = state.memory.pool
        for block in state.memory.block_ids().tolist():
            key = (id(pool), block)
            count = self.blocks.get(key, 0)
            if count == 0:
                self.block_bytes += pool.block_nbytes
            self.blocks[key] = count + 1
        hidden = _hidden_key(state)
        if hidden is not None:
            count = self.hidden.get(hidden, 0)
            if count == 0:
                self.extra += _hidden_bytes(state)
            self.hidden[hidden] = count + 1

    def remove(self, state: ModelState) -> None:
        pool = state.memory.pool
        for block in state.memory.block_ids().tolist():
            key = (id(pool), block)
            count = self.blocks[key] - 1
            if count == 0:
                del self.blocks[key]
                self.block_bytes -= pool.block_nbytes
            else:
                self.blocks[key] = count
        hidden = _hidden_key(state)
        if hidden is not None:
            count = self.hidden[hidden] - 1
            if count == 0:
                del self.hidden[hidden]
                self.extra -= _hidden_bytes(state)
            else:
                self.hidden[hidden] = count


def _hidden_key(state: ModelState) -> tuple[str, int] | None:
    """The identity of the state's last hidden state: its address (alive as long as an entry counts it)."""
    if state.last_hidden is None:
        return None
    return str(state.last_hidden.device), state.last_hidden.data_ptr()


def _hidden_bytes(state: ModelState) -> int:
    return state.nbytes - state.memory.allocated_nbytes


class StateCache:
    def __init__(self, *, device_budget: int, host_budget: int) -> None:
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self._tiers = {DEVICE: TierUsage(device_budget), HOST: TierUsage(host_budget)}
        self._pinned: set[str] = set()  # sessions with a step in flight: not chosen as victims

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, session_id: str) -> Entry | None:
        entry = self._entries.get(session_id)
        if entry is not None:
            self._entries.move_to_end(session_id)
        return entry

    def peek(self, session_id: str) -> Entry | None:
        """Like get, without counting as a use."""
        return self._entries.get(session_id)

    def replace(self, session_id: str, state: ModelState, tier: str) -> None:
        """Moves an entry's newest state to another tier (same version), keeping its place in the LRU order;
        its older versions stay behind (dropped)."""
        entry = self._entries[session_id]
        for old in entry.states():
            self._tiers[entry.tier].remove(old)
        entry.release()
        entry.state, entry.tier, entry.older = state.retain(), tier, {}
        self._tiers[tier].add(state)

    def put(
        self,
        session_id: str,
        state: ModelState,
        version: int,
        tier: str = DEVICE,
        *,
        older: dict[int, ModelState] | None = None,
        summaries: list[VersionSummary] | None = None,
    ) -> None:
        self.drop(session_id)
        held = {v: old.retain() for v, old in (older or {}).items()}
        entry = Entry(state.retain(), version, tier, held, list(summaries or []))
        self._entries[session_id] = entry
        for kept in entry.states():
            self._tiers[tier].add(kept)

    def advance(
        self, session_id: str, state: ModelState, version: int, summaries: list[VersionSummary]
    ) -> bool:
        """The session's next version, on the device where its previous one is: the previous newest joins its
        older versions and those `summaries` no longer keep go; the states that stay are not counted again (a
        commit's cost must not grow with the versions kept). False, and nothing changed, unless the entry is the
        version before on the device (then `put` it)."""
        entry = self._entries.get(session_id)
        if entry is None or entry.tier != DEVICE or entry.version != version - 1:
            return False
        usage = self._tiers[DEVICE]
        usage.add(state)
        entry.older[entry.version] = entry.state
        kept = {summary.version for summary in summaries}
        for old in [v for v in entry.older if v not in kept]:
            gone = entry.older.pop(old)
            usage.remove(gone)
            gone.release()
        entry.state, entry.version, entry.summaries = state.retain(), version, list(summaries)
        self._entries.move_to_end(session_id)
        return True

    def drop(self, session_id: str) -> Entry | None:
        """Takes the session's entry out; its states are released (their blocks go back unless a job holds
        them too). The entry returned is for its numbers: its states may hold nothing now."""
        entry = self.take(session_id)
        if entry is not None:
            entry.release()
        return entry

    def take(self, session_id: str) -> Entry | None:
        """Takes the session's entry out with the cache's holds on its states: the caller releases them."""
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            for kept in entry.states():
                self._tiers[entry.tier].remove(kept)
        return entry

    def drop_older(self, tier: str) -> bool:
        """Drops the older versions of the least recently used entry in `tier` that keeps any; False if none
        does."""
        for entry in self._entries.values():
            if entry.tier == tier and entry.older:
                for old in entry.older.values():
                    self._tiers[tier].remove(old)
                    old.release()
                entry.older = {}
                return True
        return False

    def added_bytes(self, tier: str, *states: ModelState) -> int:
        """Bytes `states` would add to `tier` (some of their blocks may already be counted there, shared)."""
        held, held_hidden = self._tiers[tier].blocks, self._tiers[tier].hidden
        seen: set[tuple[int, int]] = set()
        seen_hidden: set[tuple[str, int]] = set()
        extra = 0
        for state in states:
            pool = state.memory.pool
            hidden = _hidden_key(state)
            if hidden is not None and hidden not in held_hidden and hidden not in seen_hidden:
                seen_hidden.add(hidden)
                extra += _hidden_bytes(state)
            for block in state.memory.block_ids().tolist():
                key = (id(pool), block)
                if key not in held and key not in seen:
                    seen.add(key)
                    extra += pool.block_nbytes
        return extra

    def used(self, tier: str) -> int:
        return self._tiers[tier].used

    def budget(self, tier: str) -> int:
        return self._tiers[tier].budget

    def most_recent_first(self) -> list[str]:
        return list(reversed(self._entries))

    def count(self, tier: str) -> int:
        return sum(1 for e in self._entries.values() if e.tier == tier)

    def pin(self, session_id: str) -> None:
        """A step is in flight on this session: it stays where it is until `unpin`."""
        self._pinned.add(session_id)

    def unpin(self, session_id: str) -> None:
        self._pinned.discard(session_id)

    def pinned_bytes(self) -> int:
        """Bytes of the sessions with a step in flight (which cannot move to make room)."""
        return sum(e.state.nbytes for sid in self._pinned if (e := self._entries.get(sid)) is not None)

    def victim(self, tier: str) -> str | None:
        """The least recently used session in `tier` without a step in flight."""
        for session_id, entry in self._entries.items():
            if entry.tier == tier and session_id not in self._pinned:
                return session_id
        return None
