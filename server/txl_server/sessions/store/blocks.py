"""A session's memory as the stores keep it: blocks shared by reference, written once.

A stored version of a memory is a header (the window: how many positions, where they start in the first block,
how many were fed, the layout) and the ids of its blocks in table order; each block is one object of a few hundred
KiB to a few MiB (every layer's keys and values of its positions), never the whole memory in one object. Redis
keeps the header and each block's reference count (lua/versions.lua); the block store keeps the bytes
(sessions/blocks/). Blocks are shared the way the pool shares them: a session's versions, its forks, the sessions
started from a preloaded memory all list the same block ids, and a commit writes only the blocks the store does not
hold yet (usually the one its new positions start in and those after it).

What the store holds is tracked per pool block (`BlockIndex`): a pool block, in one incarnation (between its
allocation and its release), up to one end of its valid positions, is one stored block. Its positions past that
end are written as zeros: a block carries nothing of another session, nor of a sibling fork's later text. Its
positions before the window's start (the first block's, once the window slides) are the session's own past, from
the same incarnation, and stay: so a window that slides by a token does not write its first block again.

Format 4 keeps the bytes in the block store; format 3 (an older server's) kept them in Redis, and still loads.
Older stores wrote position-keyed blocks per session (format 2) or one safetensors value (format 1); both still
load (`legacy_state`, `ModelState.from_bytes`).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from txl import BlockPool, Memory, MemoryLayout
from txl.paged.pool import BlockTable
from txl.paged.rows import PagedRow

from ...engine.state import ModelState

FORMAT = 4  # the blocks' bytes in the block store
FORMATS = (3, 4)  # 3: an older server's, the bytes in Redis

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# A stored block, as the index knows it: (pool, block id, incarnation, end of its valid positions).
BlockKey = tuple[int, int, int, int]
# A block's bytes, as the block store takes them: bytes, or a view of a snapshot's buffer (no copy).
Buffer = bytes | memoryview


@dataclass
class StoredVersion:
    """One version of a memory to write: its header (block ids included), last hidden state, and the data of the
    blocks the store does not hold yet."""

    header: dict[str, Any]
    hidden: bytes | None
    new_blocks: dict[str, Buffer]
    # What the index learns once the store has them: each new block's key and id.
    learned: list[tuple[BlockKey, str]] = field(default_factory=list)
    # Blocks written to the block store beforehand for this version (`prewritten`), which no version lists yet:
    # new to Redis's references like `new_blocks`, their bytes already stored.
    prewritten: list[str] = field(default_factory=list)

    @property
    def new_ids(self) -> list[str]:
        """The blocks this version is the first to list: Redis counts their references from it."""
        return [*self.new_blocks, *self.prewritten]

    @property
    def block_ids(self) -> list[str]:
        return list(self.header["blocks"])

    @property
    def nbytes(self) -> int:
        """Bytes this write sends: new blocks, the hidden state and the header."""
        return (
            sum(memoryview(b).nbytes for b in self.new_blocks.values())
            + len(self.hidden or b"")
            + len(self.header_json())
        )

    def header_json(self) -> str:
        return json.dumps(self.header, separators=(",", ":"))


class BlockIndex:
    """Which pool blocks the store already holds, and under which id. Entries of a block that was released (its
    incarnation moved on) are dead and never match again; `prune` drops them."""

    def __init__(self) -> None:
        self._ids: dict[BlockKey, str] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, key: BlockKey) -> str | None:
        return self._ids.get(key)

    def learn(self, pairs: list[tuple[BlockKey, str]]) -> None:
        self._ids.update(pairs)

    def forget(self, ids: set[str]) -> None:
        """Drops the entries of blocks the store turned out not to hold (expired)."""
        self._ids = {k: v for k, v in self._ids.items() if v not in ids}

    def prune(self, pools: list[BlockPool]) -> None:
        """Drops the entries of released blocks (of `pools`; entries of other pools are kept)."""
        live: dict[BlockKey, str] = {}
        by_id = {id(p): p for p in pools}
        for key, value in self._ids.items():
            pool = by_id.get(key[0])
            if pool is None or int(pool.incarnations(np.array([key[1]]))[0]) == key[2]:
                live[key] = value
        self._ids = live


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _ends(row: PagedRow, block_size: int) -> list[int]:
    """The end of the valid positions of each block of `row`'s table (all but the last's are full)."""
    n = row.ids.size
    return [row.end - i * block_size if i == n - 1 else block_size for i in range(n)]


def block_keys(state: ModelState) -> list[BlockKey]:
    """The index key of each block of the state's memory, in table order."""
    row = state.memory.rows[0]
    pool = state.memory.pool
    incarnations = pool.incarnations(row.ids) if row.ids.size else np.zeros(0, dtype=np.int64)
    return [
        (id(pool), int(block), int(inc), end)
        for block, inc, end in zip(row.ids, incarnations, _ends(row, pool.block_size), strict=True)
    ]


def new_block_id() -> str:
    return secrets.token_hex(12)


def snapshot(
    state: ModelState,
    index: BlockIndex,
    *,
    full: bool = False,
    prewritten: dict[BlockKey, str] | None = None,
) -> StoredVersion:
    """The state as a version to store: the ids of its blocks, with the data of those neither `index` nor
    `prewritten` (blocks written beforehand, which no version lists yet) knows (all of them with `full`)."""
    early = {} if full or prewritten is None else prewritten
    memory = state.memory
    if memory.batch_size != 1:
        raise ValueError("a session's memory has one row")
    pool, row = memory.pool, memory.rows[0]
    keys = block_keys(state)
    ids: list[str] = []
    wanted: list[int] = []
    learned: list[tuple[BlockKey, str]] = []
    listed_early: list[str] = []
    for i, key in enumerate(keys):
        known = None if full else index.get(key)
        if known is None and key in early:
            known = early[key]
            listed_early.append(known)
            learned.append((key, known))
        if known is None:
            known = new_block_id()
            wanted.append(i)
            learned.append((key, known))
        ids.append(known)
    new_blocks: dict[str, Buffer] = {}
    if wanted:
        device_ids = torch.from_numpy(row.ids[wanted]).to(pool.keys.device)
        n_layer, n_head, _, block_size, d_head = pool.keys.shape
        # [n, L, 2, H, bs, Dh]: one block's bytes contiguous, gathered in one copy per tensor
        data = torch.empty(
            (len(wanted), n_layer, 2, n_head, block_size, d_head),
            dtype=pool.keys.dtype,
            device=pool.keys.device,
        )
        for k, tensor in enumerate((pool.keys, pool.values)):
            # [L, H, n, bs, Dh] -> [n, L, H, bs, Dh]
            data[:, :, k].copy_(tensor.index_select(2, device_ids).permute(2, 0, 1, 3, 4))
        data = data.cpu()
        for j, i in enumerate(wanted):
            end = keys[i][3]
            data[j, ..., end:, :] = 0
            # [L, 2, H, bs, Dh] as bytes: a view of the snapshot's buffer, which it keeps alive
            new_blocks[ids[i]] = data[j].view(torch.uint8).reshape(-1).numpy().data
    layout = memory.layout
    header = {
        "format": FORMAT,
        "mem_len": memory.mem_len,
        "grid": memory.grid,
        "fed": state.fed,
        "tail": list(state.tail),
        "length": row.length,
        "start": row.start,
        "block_size": pool.block_size,
        "layout": [layout.n_layer, layout.n_head, layout.d_head, layout.d_model],
        "dtype": _dtype_name(layout.dtype),
        "blocks": ids,
    }
    hidden = None
    if state.last_hidden is not None:
        hidden = state.last_hidden.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return StoredVersion(header, hidden, new_blocks, learned, listed_early)


@dataclass(frozen=True)
class _Window:
    mem_len: int
    grid: int | None
    fed: int
    tail: tuple[int, ...]
    length: int
    start: int
    block_size: int
    dtype: torch.dtype


def _window(header: dict[str, Any], layout: MemoryLayout, grid: int | None) -> _Window:
    try:
        if list(header["layout"]) != [layout.n_layer, layout.n_head, layout.d_head, layout.d_model]:
            raise ValueError("the memory was made by a model of another shape")
        if "grid" in header:
            grid = int(header["grid"]) if header["grid"] is not None else None
        window = _Window(
            int(header["mem_len"]),
            grid,
            int(header["fed"]),
            tuple(int(t) for t in header["tail"]),
            int(header["length"]),
            int(header["start"]),
            int(header["block_size"]),
            _DTYPES[header["dtype"]],
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed memory header: {exc}") from exc
    if window.grid is not None and window.grid < 1:
        raise ValueError("the window grid must be positive")
    if not 0 <= window.start < max(window.block_size, 1) or window.length < 0 or window.fed < window.length:
        raise ValueError("inconsistent memory header")
    return window


def _hidden(hidden: bytes | None, layout: MemoryLayout, dtype: torch.dtype) -> Tensor | None:
    if hidden is None:
        return None
    if len(hidden) != layout.d_model * torch.empty((), dtype=dtype).element_size():
        raise ValueError("the stored last hidden state does not have the model's width")
    return (
        torch.frombuffer(bytearray(hidden), dtype=torch.uint8)
        .view(dtype)
        .to(device=layout.device, dtype=layout.dtype)
    )


def _into_pool(parts: list[Tensor], window: _Window, layout: MemoryLayout, pool: BlockPool) -> PagedRow:
    """Blocks [L, 2, H, bs, Dh] each, in table order -> a row of `pool` holding the window's positions."""
    n = len(parts)
    if n == 0:
        return PagedRow(None, fed=window.fed)
    bs = pool.block_size
    data = torch.stack(parts).to(dtype=layout.dtype, device=pool.keys.device)  # [n, L, 2, H, bs, Dh]
    ids = pool.allocate(n, zero=False)  # whole blocks written below
    table = BlockTable(pool, ids, owned=True)
    index = torch.from_numpy(ids).to(pool.keys.device)
    pool.keys[:, :, index] = data[:, :, 0].permute(1, 2, 0, 3, 4)
    pool.values[:, :, index] = data[:, :, 1].permute(1, 2, 0, 3, 4)
    for block in ids:
        pool.set_filled(int(block), bs)  # nothing appends into a restored block in place but its last
    pool.set_filled(int(ids[-1]), window.start + window.length - (n - 1) * bs)
    return PagedRow(table, window.start, window.length, window.fed)


def _blocks(raw: list[bytes], window: _Window, layout: MemoryLayout) -> list[Tensor]:
    shape = (layout.n_layer, 2, layout.n_head, window.block_size, layout.d_head)
    size = int(np.prod(shape)) * torch.empty((), dtype=window.dtype).element_size()
    if any(len(b) != size for b in raw):
        raise ValueError("a stored block has the wrong size")
    return [torch.frombuffer(bytearray(b), dtype=torch.uint8).view(window.dtype).view(shape) for b in raw]


def restore(
    header: dict[str, Any],
    hidden: bytes | None,
    blocks: list[bytes],
    layout: MemoryLayout,
    pool: BlockPool,
    index: BlockIndex,
    *,
    grid: int | None = None,
) -> ModelState:
    """A stored version (its blocks' data in table order) as a state in `pool`; the index learns that the store
    holds the new pool blocks. ValueError if anything does not fit. `grid`: the window grid of a header that does
    not record one."""
    if int(header.get("format", 0)) not in FORMATS:
        raise ValueError(f"unknown block format {header.get('format')}")
    window = _window(header, layout, grid)
    if window.block_size != pool.block_size:
        raise ValueError(f"stored blocks hold {window.block_size} positions, this server's {pool.block_size}")
    ids = list(header["blocks"])
    n = -(-(window.start + window.length) // window.block_size)
    if len(ids) != n or len(blocks) != n:
        raise ValueError("the stored version lists the wrong number of blocks")
    row = _into_pool(_blocks(blocks, window, layout), window, layout, pool)
    memory = Memory(pool, mem_len=window.mem_len, rows=[row], grid=window.grid)
    state = ModelState(memory, _hidden(hidden, layout, window.dtype), window.tail)
    index.learn(list(zip(block_keys(state), ids, strict=True)))
    return state


def legacy_state(
    header: dict[str, Any],
    hidden: bytes | None,
    blocks: dict[int, bytes],
    layout: MemoryLayout,
    pool: BlockPool,
    *,
    grid: int | None = None,
) -> ModelState:
    """A memory stored by an older server in format 2 (blocks keyed by their first position, every block
    present), into `pool`."""
    if int(header.get("format", 0)) != 2:
        raise ValueError(f"unknown block format {header.get('format')}")
    window = _window(header, layout, grid)
    if window.block_size != pool.block_size:
        raise ValueError(f"stored blocks hold {window.block_size} positions, this server's {pool.block_size}")
    try:
        n, first = int(header["blocks"]), int(header["first"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed memory header: {exc}") from exc
    if n != -(-(window.start + window.length) // window.block_size):
        raise ValueError("inconsistent memory header")
    raw = []
    for i in range(n):
        block = blocks.get(first + i * window.block_size)
        if block is None:
            raise ValueError(f"block {first + i * window.block_size} is missing")
        raw.append(block)
    row = _into_pool(_blocks(raw, window, layout), window, layout, pool)
    memory = Memory(pool, mem_len=window.mem_len, rows=[row], grid=window.grid)
    return ModelState(memory, _hidden(hidden, layout, window.dtype), window.tail)
