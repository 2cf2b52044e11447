"""The block pool: the keys and values of every sequence live in one pool of fixed-size blocks.

A block holds `block_size` consecutive positions of one sequence for every layer: keys and values (and the layer
inputs, in a pool that keeps hidden states for HF's `mems`). A sequence's memory is a table of block ids, the
offset of its first position in the first block and its length (vLLM's PagedAttention layout, Kwon et al.,
2023). Sliding past `mem_len` frees whole blocks; sequences that share a past (a fork; a step and the memory it
started from) share its blocks, so a fork costs a table, not a copy.

Blocks are reference counted by the `BlockTable`s that list them and go back to the pool when the last table
holding them is released. Release is explicit, by the table's holders (a memory, a step, a server's state cache):
nothing waits for the garbage collector, as vLLM's block pool frees a request's blocks when the request ends. They are written append-only: the positions of a block below its `filled` mark are never written again,
so every table that reads them sees the same values. A step appends in place when its memory ends exactly at its
last block's mark (the newest version of a session: the common case); otherwise that partial block is copied
first (copy-on-write: a second branch from an older memory, or a fork that writes). A block handed out again
is zeroed first, and attention reads only the positions of its own rows, so nothing of one sequence is ever read
by another.

Pools are driven by one thread at a time (the one stepping); tables may be held and released from any thread.
How a row of memory sits in the pool and how a step makes room after it: txl.paged.rows.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from .layout import MemoryLayout
from .staging import StagedIds

NULL_BLOCK = 0  # always zero, never handed out: pads block tables to a common width

DEFAULT_BLOCK_SIZE = 16


class PoolExhausted(RuntimeError):
    """No free block is left in a pool that may not grow."""


class ReleasedError(RuntimeError):
    """A table (or a memory) used after its last holder released it."""


# Tables of up to this many blocks count their references one by one: a decoding step drops or extends a few
# short tables, and for them `np.add.at` and its masks cost more than a loop over the ids does.
SMALL_TABLE = 8


class BlockPool:
    """Keys and values of fixed-size blocks, for every layer, on one device.

    keys, values: [n_layer, n_head, n_blocks, block_size, d_head]; hidden: [n_layer, n_blocks, block_size,
    d_model] when the pool keeps layer inputs. Block 0 is the null block.
    """

    def __init__(
        self,
        layout: MemoryLayout,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        blocks: int = 64,
        keep_hidden: bool = False,
        growable: bool = True,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if blocks < 2:
            raise ValueError(f"a pool needs at least 2 blocks (one is the null block), got {blocks}")
        self.layout = layout
        self.block_size = block_size
        self.keep_hidden = keep_hidden
        self.growable = growable
        # Re-entrant: a memory releases its tables under one hold of the lock (txl.memory).
        self._lock = threading.RLock()
        # Bumped whenever the tensors are reallocated (CUDA graphs captured on the old ones are then stale).
        self.generation = 0
        self._allocate_tensors(blocks)
        self._refs = np.zeros(blocks, dtype=np.int64)
        self._refs[NULL_BLOCK] = 1  # pinned
        self._filled = np.zeros(blocks, dtype=np.int64)
        # How many times each block was handed out: (block, incarnation) names one content for the block's life,
        # so that what was made of a block (e.g. its copy in Redis) is never mistaken for its next owner's.
        self._incarnations = np.zeros(blocks, dtype=np.int64)
        # A min-heap: the lowest free ids are handed out first, so that memories allocated after others were freed
        # get ascending, mostly adjacent blocks. A stack handed a freed batch back in reverse order, and reading a
        # row's blocks backwards through memory slowed a large decoding batch (docs/model.md).
        self._free = list(range(1, blocks))
        self._reserved = 0
        self._zero_later: list[np.ndarray] | None = None  # ids allocated inside zeroing_together()
        self._ids_to_device = StagedIds(layout.device)
        self.live_tables = 0  # block tables held (not yet released): 0 once everything was released

    def _allocate_tensors(self, blocks: int) -> None:
        lay = self.layout
        kv_shape = (lay.n_layer, lay.n_head, blocks, self.block_size, lay.d_head)
        # Pool tensors are ordinary tensors even when first used inside inference_mode, so that later steps
        # outside it may still write them. Left uninitialised (a large pool on a CPU then costs memory only as
        # it is used): every block is zeroed when it is handed out, and the null block here.
        with torch.inference_mode(False):
            self.keys = torch.empty(kv_shape, dtype=lay.dtype, device=lay.device)
            self.values = torch.empty(kv_shape, dtype=lay.dtype, device=lay.device)
            self.hidden = (
                torch.empty(
                    (lay.n_layer, blocks, self.block_size, lay.d_model), dtype=lay.dtype, device=lay.device
                )
                if self.keep_hidden
                else None
            )
        self.keys[:, :, NULL_BLOCK] = 0
        self.values[:, :, NULL_BLOCK] = 0
        if self.hidden is not None:
            self.hidden[:, NULL_BLOCK] = 0

    @property
    def lock(self) -> threading.RLock:
        """The pool's lock (re-entrant): held, several holds are given back as one."""
        return self._lock

    # ------------------------------------------------------------------ sizes

    @property
    def n_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
        return self.keys.size(2)

    @property
    def capacity(self) -> int:
        """Blocks that can hold positions (all but the null block)."""
        return self.n_blocks - 1

    @property
    def block_nbytes(self) -> int:
        """Bytes one block takes: its positions of every layer."""
        return self.block_size * self.layout.bytes_per_position(self.keep_hidden)

    @property
    def used_blocks(self) -> int:
        with self._lock:
            return self.capacity - len(self._free)

    @property
    def reserved_blocks(self) -> int:
        return self._reserved

    @property
    def available_blocks(self) -> int:
        """Free blocks not promised to a reservation."""
        with self._lock:
            return len(self._free) - self._reserved

    def blocks_for(self, positions: int) -> int:
        return math.ceil(positions / self.block_size)

    # ------------------------------------------------------------------ blocks

    def allocate(self, n: int, reservation: Reservation | None = None, *, zero: bool = True) -> np.ndarray:
        """`n` zeroed blocks (with `zero`: the caller writes every position otherwise), each with one reference
        (owned by the caller: wrap them in a BlockTable with `owned=True`). Drawn from `reservation` first, then
        from what no reservation holds."""
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        with self._lock:
            from_reservation = min(n, reservation.remaining) if reservation is not None else 0
            unreserved = n - from_reservation
            if unreserved > len(self._free) - self._reserved:
                self._grow(unreserved - (len(self._free) - self._reserved))
            if reservation is not None:
                reservation.remaining -= from_reservation
                self._reserved -= from_reservation
            ids = np.array([heapq.heappop(self._free) for _ in range(n)], dtype=np.int64)
            self._refs[ids] = 1
            self._filled[ids] = 0
            self._incarnations[ids] += 1
        if not zero:
            return ids
        if self._zero_later is not None:
            self._zero_later.append(ids)
        else:
            self._zero(ids)
        return ids

    @contextlib.contextmanager
    def zeroing_together(self) -> Iterator[None]:
        """Blocks allocated inside the block are zeroed together when it ends: one copy of their ids to the
        device and one fill per tensor, whatever their number (a decoding step of 64 rows may take 64)."""
        if self._zero_later is not None:  # nested: the outer block zeroes them
            yield
            return
        self._zero_later = []
        try:
            yield
        finally:
            pending, self._zero_later = self._zero_later, None
            if pending:
                self._zero(np.concatenate(pending))

    def _zero(self, ids: np.ndarray) -> None:
        index = self._ids_to_device.send(ids)
        self.keys.index_fill_(2, index, 0)
        self.values.index_fill_(2, index, 0)
        if self.hidden is not None:
            self.hidden.index_fill_(1, index, 0)

    def _grow(self, at_least: int) -> None:
        if not self.growable:
            raise PoolExhausted(
                f"the memory pool is full ({self.capacity} blocks of {self.block_size} positions in use or "
                "reserved)"
            )
        old = self.n_blocks
        new = max(2 * old, old + at_least)
        keys, values, hidden = self.keys, self.values, self.hidden
        self._allocate_tensors(new)
        self.keys[:, :, :old].copy_(keys)
        self.values[:, :, :old].copy_(values)
        if hidden is not None and self.hidden is not None:
            self.hidden[:, :old].copy_(hidden)
        self._refs = np.concatenate([self._refs, np.zeros(new - old, dtype=np.int64)])
        self._filled = np.concatenate([self._filled, np.zeros(new - old, dtype=np.int64)])
        self._incarnations = np.concatenate([self._incarnations, np.zeros(new - old, dtype=np.int64)])
        self._free.extend(range(old, new))  # larger than every id before them: still a heap
        self.generation += 1

    def release(self) -> None:
        """Gives the pool's memory back (a stopped server's): the tensors keep their shapes on the meta device,
        so sizes still read, and any later read or write of a block fails loudly instead of touching freed
        memory. Pools otherwise live until the cycle collector reaches their owner, which may be long after a
        stop: a process that starts servers one after another (tests, a restart in place) kept them all."""
        with self._lock:
            self.keys = self.keys.to("meta")
            self.values = self.values.to("meta")
            if self.hidden is not None:
                self.hidden = self.hidden.to("meta")
            self.generation += 1

    def incref(self, ids: np.ndarray) -> None:
        if not ids.size:
            return
        with self._lock:
            if ids.size > SMALL_TABLE:
                np.add.at(self._refs, ids, 1)
                return
            refs = self._refs
            for block in ids.tolist():
                refs[block] += 1

    def decref(self, ids: np.ndarray) -> None:
        if not ids.size:
            return
        with self._lock:
            refs = self._refs
            if ids.size > SMALL_TABLE:
                np.subtract.at(refs, ids, 1)
                for block in np.unique(ids[refs[ids] == 0]).tolist():  # a repeated id is freed once
                    heapq.heappush(self._free, block)
                return
            for block in ids.tolist():  # repeated ids count once each, as with np.subtract.at
                left = refs[block] - 1
                refs[block] = left
                if left == 0:
                    heapq.heappush(self._free, block)

    def refcount(self, block: int) -> int:
        return int(self._refs[block])

    def incarnations(self, ids: np.ndarray) -> np.ndarray:
        """How many times each of `ids` has been handed out (see `_incarnations`)."""
        with self._lock:
            return self._incarnations[ids].copy()

    def claim(self, block: int, offset: int, n: int) -> bool:
        """Claims positions [offset, offset + n) of `block` for writing, if nothing was written at `offset` or
        after yet (the caller's sequence ends at the block's mark). A failed step leaves its claim unused."""
        with self._lock:
            if self._filled[block] != offset:
                return False
            self._filled[block] = offset + n
            return True

    def filled(self, block: int) -> int:
        """Block `block`'s mark: how many of its positions have been written (or claimed)."""
        with self._lock:
            return int(self._filled[block])

    def set_filled(self, blocks: int | np.ndarray, n: int) -> None:
        """Sets the mark of `blocks` (one id, or an array of them) to `n`."""
        with self._lock:
            self._filled[blocks] = n

    @contextlib.contextmanager
    def fill_marks(self) -> Iterator[np.ndarray]:
        """Every block's mark, as the pool's own array, held under the pool's lock for the block: planning many
        rows at once reads the marks and advances those its rows claim (txl.paged.decode_plan), as `claim` would
        one at a time."""
        with self._lock:
            yield self._filled

    def copy_positions(self, source: int, target: int, n: int) -> None:
        """Makes block `target` the first `n` positions of block `source` (every layer), zeros after them."""
        self.keys[:, :, target, :n] = self.keys[:, :, source, :n]
        self.values[:, :, target, :n] = self.values[:, :, source, :n]
        self.keys[:, :, target, n:] = 0
        self.values[:, :, target, n:] = 0
        if self.hidden is not None:
            self.hidden[:, target, :n] = self.hidden[:, source, :n]
            self.hidden[:, target, n:] = 0

    # ------------------------------------------------------------------ reservations

    def reserve(self, n: int) -> Reservation:
        """Promises `n` blocks to one piece of work, so that its steps cannot run out of room midway."""
        with self._lock:
            if n > len(self._free) - self._reserved:
                self._grow(n - (len(self._free) - self._reserved))
            self._reserved += n
        return Reservation(self, n)

    def _release(self, n: int) -> None:
        with self._lock:
            self._reserved -= n

    def __repr__(self) -> str:
        return (
            f"BlockPool(blocks={self.capacity}, used={self.used_blocks}, reserved={self._reserved}, "
            f"block_size={self.block_size}, dtype={self.layout.dtype}, device={self.layout.device})"
        )


class Reservation:
    """Blocks promised to one piece of work; what it did not use goes back when it is released (a context
    manager: at the end of its block)."""

    def __init__(self, pool: BlockPool, n: int) -> None:
        self.pool = pool
        self.remaining = n

    def release(self) -> None:
        """Gives back the blocks not used (idempotent)."""
        remaining, self.remaining = self.remaining, 0
        if remaining:
            self.pool._release(remaining)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class BlockTable:
    """An immutable list of block ids holding one reference to each, for as long as it has holders.

    Whoever makes a table holds it; `retain` adds a holder (a second memory sharing it), `release` removes one,
    and the last release gives the references back to the pool at once. A table is never released by the garbage
    collector: its holders release it (txl.memory, txl.paged.rows)."""

    __slots__ = ("holders", "ids", "pool")

    def __init__(self, pool: BlockPool, ids: np.ndarray, *, owned: bool = False) -> None:
        self.pool = pool
        self.ids = ids
        self.holders = 1
        with pool._lock:
            if not owned:
                pool.incref(ids)
            pool.live_tables += 1

    def __len__(self) -> int:
        return int(self.ids.size)

    def retain(self) -> BlockTable:
        """One more holder (the caller's); this table."""
        with self.pool._lock:
            if self.holders <= 0:
                raise ReleasedError("this block table was released: its blocks may hold another sequence now")
            self.holders += 1
        return self

    def release(self) -> None:
        """One holder fewer; the last gives the table's blocks back to the pool."""
        pool = self.pool
        with pool._lock:
            if self.holders <= 0:
                raise ReleasedError("this block table was released more often than it was held")
            self.holders -= 1
            if self.holders == 0:
                pool.live_tables -= 1
                pool.decref(self.ids)

    @property
    def released(self) -> bool:
        return self.holders == 0


def retain_all(pool: BlockPool, tables: Sequence[BlockTable | None]) -> None:
    """`retain` on each of `tables` (of `pool`), under one hold of the pool's lock: a decoding step's results
    share the tables of most of its rows."""
    with pool._lock:
        for table in tables:
            if table is None:
                continue
            if table.holders <= 0:
                raise ReleasedError("this block table was released: its blocks may hold another sequence now")
            table.holders += 1


_default_pools: dict[tuple[MemoryLayout, bool], BlockPool] = {}
_default_pools_lock = threading.Lock()


def default_pool(layout: MemoryLayout, *, keep_hidden: bool = False) -> BlockPool:
    """The process-wide growable pool for memories of `layout` that were not given a pool of their own (a
    server makes its own pools, sized to its budgets)."""
    key = (layout, keep_hidden)
    with _default_pools_lock:
        pool = _default_pools.get(key)
        if pool is None:
            pool = _default_pools[key] = BlockPool(layout, keep_hidden=keep_hidden)
        return pool
