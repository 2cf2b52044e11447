"""A session's memory as blocks, the form Redis keeps: a commit writes only the blocks that changed.

A session's positions are numbered from its first token. Its memory's blocks are aligned to that numbering (a
block covers positions [key, key + block_size), `key` its first), so the block holding position p keeps its key
for the session's whole life: a commit that adds positions rewrites the block they start in and writes the new
ones after it; the blocks that slid out of the window are deleted; every other block is already in Redis. Each
block is one value of a few hundred KiB to a few MiB (every layer's keys and values of its positions), never the
whole memory in one value.

Positions of a block outside the session's window (before its first position, after its last) are written as
zeros: a block carries nothing of another session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from txl import BlockPool, Memory, MemoryLayout
from txl.paged import BlockTable, PagedRow

from .state import ModelState

FORMAT = 2

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class BlockSnapshot:
    header: dict[str, Any]  # what the blocks are: format, layout, window, tail
    hidden: bytes | None  # the last hidden state
    blocks: dict[int, bytes]  # key (first position) -> every layer's keys and values of its positions
    full: bool  # all the memory's blocks (else only those holding positions at or after `since`)

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.blocks.values()) + len(self.hidden or b"")

    def header_json(self) -> str:
        return json.dumps(self.header, separators=(",", ":"))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def block_keys(state: ModelState) -> list[int]:
    """The key of each block of the state's memory, in table order."""
    row = state.memory.rows[0]
    bs = state.memory.pool.block_size
    first = state.fed - row.length - row.start
    return [first + i * bs for i in range(row.ids.size)]


def snapshot_blocks(state: ModelState, since: int | None = None) -> BlockSnapshot:
    """The state's blocks holding a position at or after `since` (None: all), with the header and hidden state."""
    memory = state.memory
    if memory.batch_size != 1:
        raise ValueError("a session's memory has one row")
    pool, row = memory.pool, memory.rows[0]
    bs = pool.block_size
    keys = block_keys(state)
    wanted = [i for i, key in enumerate(keys) if since is None or key + bs > since]
    blocks: dict[int, bytes] = {}
    if wanted:
        ids = torch.from_numpy(row.ids[wanted]).to(pool.keys.device)
        # [L, H, n, bs, Dh] twice -> [n, L, 2, H, bs, Dh]: one block's bytes contiguous
        data = torch.stack([pool.keys[:, :, ids], pool.values[:, :, ids]], dim=2).permute(3, 0, 2, 1, 4, 5)
        data = data.contiguous().cpu()
        for j, i in enumerate(wanted):
            lo = row.start if i == 0 else 0
            hi = row.end - i * bs if i == row.ids.size - 1 else bs
            block = data[j]
            if lo > 0 or hi < bs:
                block[..., :lo, :] = 0
                block[..., hi:, :] = 0
            blocks[keys[i]] = block.view(torch.uint8).numpy().tobytes()
    layout = memory.layout
    header = {
        "format": FORMAT,
        "mem_len": memory.mem_len,
        "grid": memory.grid,
        "fed": state.fed,
        "tail": list(state.tail),
        "length": row.length,
        "start": row.start,
        "first": keys[0] if keys else 0,
        "blocks": len(keys),
        "block_size": bs,
        "layout": [layout.n_layer, layout.n_head, layout.d_head, layout.d_model],
        "dtype": _dtype_name(layout.dtype),
    }
    hidden = None
    if state.last_hidden is not None:
        hidden = state.last_hidden.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return BlockSnapshot(header, hidden, blocks, since is None)


def state_from_blocks(
    header: dict[str, Any],
    hidden: bytes | None,
    blocks: dict[int, bytes],
    layout: MemoryLayout,
    pool: BlockPool,
    *,
    grid: int | None = None,
) -> ModelState:
    """Inverse of `snapshot_blocks` (every block present), into `pool`; ValueError if anything does not fit.
    `grid`: the window grid of blocks whose header does not record one (written before windows were fixed on a
    grid)."""
    try:
        if int(header["format"]) != FORMAT:
            raise ValueError(f"unknown block format {header['format']}")
        expected = [layout.n_layer, layout.n_head, layout.d_head, layout.d_model]
        if list(header["layout"]) != expected:
            raise ValueError("the memory was made by a model of another shape")
        dtype = _DTYPES[header["dtype"]]
        bs, n = int(header["block_size"]), int(header["blocks"])
        length, start, first = int(header["length"]), int(header["start"]), int(header["first"])
        mem_len, fed = int(header["mem_len"]), int(header["fed"])
        tail = tuple(int(t) for t in header["tail"])
        if "grid" in header:
            grid = int(header["grid"]) if header["grid"] is not None else None
        if grid is not None and grid < 1:
            raise ValueError("the window grid must be positive")
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed memory header: {exc}") from exc
    if bs != pool.block_size:
        raise ValueError(f"stored blocks hold {bs} positions, this server's {pool.block_size}")
    if not 0 <= start < max(bs, 1) or length < 0 or n != -(-(start + length) // bs) or fed < length:
        raise ValueError("inconsistent memory header")
    shape = (layout.n_layer, 2, layout.n_head, bs, layout.d_head)
    size = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    parts: list[Tensor] = []
    for i in range(n):
        raw = blocks.get(first + i * bs)
        if raw is None or len(raw) != size:
            raise ValueError(f"block {first + i * bs} is missing or has the wrong size")
        parts.append(torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).view(shape))
    last_hidden = None
    if hidden is not None:
        width = layout.d_model * torch.empty((), dtype=dtype).element_size()
        if len(hidden) != width:
            raise ValueError("the stored last hidden state does not have the model's width")
        last_hidden = torch.frombuffer(bytearray(hidden), dtype=torch.uint8).view(dtype)
        last_hidden = last_hidden.to(dtype=layout.dtype, device=layout.device)
    if n == 0:
        return ModelState(
            Memory(pool, mem_len=mem_len, rows=[PagedRow(None, fed=fed)], grid=grid), last_hidden, tail
        )
    data = torch.stack(parts).to(dtype=layout.dtype, device=pool.keys.device)  # [n, L, 2, H, bs, Dh]
    ids = pool.allocate(n)
    table = BlockTable(pool, ids, owned=True)
    index = torch.from_numpy(ids).to(pool.keys.device)
    pool.keys[:, :, index] = data[:, :, 0].permute(1, 2, 0, 3, 4)
    pool.values[:, :, index] = data[:, :, 1].permute(1, 2, 0, 3, 4)
    for block in ids:
        pool.set_filled(int(block), bs)
    pool.set_filled(int(ids[-1]), start + length - (n - 1) * bs)
    memory = Memory(pool, mem_len=mem_len, rows=[PagedRow(table, start, length, fed)], grid=grid)
    return ModelState(memory, last_hidden, tail)
