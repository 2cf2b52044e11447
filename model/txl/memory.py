"""Segment memory: what a Transformer-XL carries from one segment to the next.

The paper's memory is the previous segments' hidden states, one `[mem_len, d_model]` block per layer, which every
step projects again into keys and values. Serving many steps over a long memory, that re-projection is most of the
work (docs/model.md), so `Memory` stores what attention reads: per layer, the
projected keys and values of the last `mem_len` positions. Projection is per position, so the two are the same
function.

A `Memory` is an immutable view of one or more sequences (rows) whose positions live in a shared pool of
fixed-size blocks (`txl.paged.pool`). A step never changes the memory it was given: it returns a new one, and the old
one stays valid until released, so a server can roll a step back or fork a session; the two share every block
they have in common. Rows of one memory may hold different lengths, and memories of different lengths step
together in one forward.

A memory a step returns (or `retain`, `to_pool`, `from_tensors`, `with_mem_len` make) holds its blocks: its owner
calls `release` when done with it (a server: when a session's version is replaced or evicted, a job ends or
fails), and the blocks no other memory holds go back to the pool at once. `row`, `stack` and `like` are views
that hold nothing: they are valid while the memory they came from is. Nothing is given back by the garbage
collector: a memory dropped without `release` keeps its blocks until its pool goes (`BlockPool.live_tables`
counts the tables still held, for leak checks).

`HiddenMemory` is the paper's form (detached hidden states, re-projected every step with gradients flowing into the
projection): training uses it, and it is the form HF exchanges (`mems`), so memories can be imported and exported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .attention import LayerInput, ProjectKV
from .paged.layout import MemoryLayout
from .paged.pool import DEFAULT_BLOCK_SIZE, BlockPool, BlockTable, default_pool, retain_all
from .paged.rows import EMPTY_ROW, PagedRow, gather_positions, peak_blocks
from .window import WindowRule, window_rule


class Memory:
    """Keys and values of the last <= `mem_len` positions of `batch_size` sequences, per layer, in a block pool.

    Batch several sequences by passing a list of memories (or one memory of several rows) to the model; rows
    may hold different lengths.
    """

    __slots__ = (
        "__weakref__",
        "_owns",
        "grid",
        "mem_len",
        "pool",
        "rows",
    )  # weakly referenced: a batch's rows

    def __init__(
        self,
        pool: BlockPool,
        *,
        mem_len: int,
        rows: Sequence[PagedRow] | None = None,
        batch_size: int = 1,
        grid: int | None = None,
    ) -> None:
        if mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {mem_len}")
        if grid is not None and grid < 1:
            raise ValueError(f"grid must be >= 1, got {grid}")
        self.pool = pool
        self.mem_len = mem_len
        # Windows on an absolute segment grid (see txl.window): the memory is then a function of its tokens
        # alone, however they were cut into steps. None: HF's windows, which follow the steps as fed.
        self.grid = grid
        self.rows: tuple[PagedRow, ...] = tuple(rows) if rows is not None else (EMPTY_ROW,) * batch_size
        self._owns = True  # the rows' holds on their tables were handed to it

    @classmethod
    def empty(
        cls,
        layout: MemoryLayout,
        *,
        batch_size: int = 1,
        mem_len: int,
        keep_hidden: bool = False,
        grid: int | None = None,
    ) -> Memory:
        """A memory holding nothing, in the process-wide pool for `layout`."""
        pool = default_pool(layout, keep_hidden=keep_hidden)
        return cls(pool, mem_len=mem_len, batch_size=batch_size, grid=grid)

    def rule(self, same_length: bool) -> WindowRule:
        """The window rule this memory's steps follow, for a model with `same_length`."""
        return window_rule(self.mem_len, same_length, self.grid)

    def like(self, rows: Sequence[PagedRow], *, owns: bool = False) -> Memory:
        """A memory of the same pool and window rule of `rows`: a view holding nothing, or with `owns`, the owner
        of the rows' holds on their tables (a step's results)."""
        # Not through __init__: this one's parameters are checked, and a decoding step makes one per row.
        memory = Memory.__new__(Memory)
        memory.pool, memory.mem_len, memory.grid = self.pool, self.mem_len, self.grid
        memory.rows = tuple(rows)
        memory._owns = owns
        return memory

    # ------------------------------------------------------------------ lifetime

    def retain(self) -> Memory:
        """The same rows, held once more: a memory its new owner releases (ReleasedError if this one's blocks
        were released already)."""
        retain_all(self.pool, [row.table for row in self.rows])
        return self.like(self.rows, owns=True)

    def release(self) -> None:
        """Gives this memory's holds back (idempotent; a view holds nothing): blocks no other memory holds go back
        to the pool now. Reading it afterwards is an error the pool cannot see: its blocks may hold another
        sequence."""
        if not self._owns:
            return
        self._owns = False
        with self.pool.lock:
            for row in self.rows:
                if row.table is not None:
                    row.table.release()

    @property
    def owns(self) -> bool:
        """It holds its blocks (not a view, not released)."""
        return self._owns

    # ------------------------------------------------------------------ reading

    @property
    def layout(self) -> MemoryLayout:
        return self.pool.layout

    @property
    def keep_hidden(self) -> bool:
        return self.pool.keep_hidden

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> list[int]:
        return [row.length for row in self.rows]

    @property
    def fed(self) -> list[int]:
        """Per row, the positions fed over its life (the rows hold the last `lengths` of them)."""
        return [row.fed for row in self.rows]

    @property
    def length(self) -> int:
        """Positions held, the same for every row (ValueError if the rows differ: see `lengths`)."""
        lengths = set(self.lengths)
        if len(lengths) > 1:
            raise ValueError(f"the rows of this memory hold different lengths {self.lengths}")
        return lengths.pop() if lengths else 0

    def __len__(self) -> int:
        return self.length

    def keys(self, layer: int) -> Tensor:
        """[B, H, L, Dh], a dense copy (rows of equal length)."""
        return self._dense(self.pool.keys[layer], block_dim=1, batch_dim=0)

    def values(self, layer: int) -> Tensor:
        return self._dense(self.pool.values[layer], block_dim=1, batch_dim=0)

    def hidden_states(self) -> list[Tensor]:
        """Per layer [B, L, d_model]: the input of each layer at the held positions (HF's `mems`, batch first)."""
        if self.pool.hidden is None:
            raise ValueError("this memory does not keep hidden states; create it with keep_hidden=True")
        return [self._dense(h, block_dim=0, batch_dim=0) for h in self.pool.hidden]

    def _dense(self, pool_tensor: Tensor, *, block_dim: int, batch_dim: int) -> Tensor:
        self.length  # noqa: B018 - raises for rows of different lengths
        return torch.stack([gather_positions(pool_tensor, row, block_dim) for row in self.rows], batch_dim)

    @property
    def nbytes(self) -> int:
        """Exact bytes of the positions held (keys and values, plus hidden states if kept)."""
        return sum(self.lengths) * self.layout.bytes_per_position(self.keep_hidden)

    def block_ids(self) -> np.ndarray:
        """The distinct pool blocks this memory's rows read."""
        ids = [row.ids for row in self.rows if row.table is not None]
        return np.unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64)

    @property
    def allocated_nbytes(self) -> int:
        """Bytes of the blocks this memory keeps alive (shared with other memories that hold them too)."""
        return int(self.block_ids().size) * self.pool.block_nbytes

    def shares_blocks_with(self, other: Memory) -> bool:
        return self.pool is other.pool and bool(np.intersect1d(self.block_ids(), other.block_ids()).size)

    def __repr__(self) -> str:
        return (
            f"Memory(batch={self.batch_size}, lengths={self.lengths}, mem_len={self.mem_len}, grid={self.grid}, "
            f"dtype={self.layout.dtype}, device={self.layout.device}, nbytes={self.nbytes})"
        )

    # ------------------------------------------------------------------ new views

    def row(self, index: int) -> Memory:
        """Row `index` alone (no copy)."""
        return self.like([self.rows[index]])

    @classmethod
    def stack(cls, memories: Sequence[Memory]) -> Memory:
        """The rows of several memories of one pool, mem_len and grid, as one memory (no copy)."""
        first = memories[0]
        if any(
            m.pool is not first.pool or (m.mem_len, m.grid) != (first.mem_len, first.grid) for m in memories
        ):
            raise ValueError("only memories of one pool, one mem_len and one grid stack")
        return first.like([row for m in memories for row in m.rows])

    def with_mem_len(self, mem_len: int, *, same_length: bool = False) -> Memory:
        """The same memory governed by another `mem_len`; shrinking drops the oldest positions (no copy)."""
        rule = WindowRule(mem_len, same_length, self.grid)
        with self.pool.lock:
            rows = [_last(row, rule.keep(row.fed), self.pool) for row in self.rows]
        return Memory(self.pool, mem_len=mem_len, rows=rows, grid=self.grid)

    def to_pool(self, pool: BlockPool) -> Memory:
        """A copy in another pool (another device or dtype: tier moves), block for block."""
        if pool.block_size != self.pool.block_size or pool.keep_hidden != self.keep_hidden:
            raise ValueError("the target pool has another block size or hidden-state setting")
        rows: list[PagedRow] = []
        with _released_on_failure(rows):
            for row in self.rows:
                rows.append(self._copy_row(row, pool))
        return Memory(pool, mem_len=self.mem_len, rows=rows, grid=self.grid)

    def _copy_row(self, row: PagedRow, pool: BlockPool) -> PagedRow:
        if row.table is None:
            return PagedRow(None, fed=row.fed)
        source = torch.from_numpy(row.ids).to(self.pool.keys.device)
        ids = pool.allocate(row.ids.size, zero=False)  # every position written below
        table = BlockTable(pool, ids, owned=True)
        with _released_on_failure([PagedRow(table)]):
            target = torch.from_numpy(ids).to(pool.keys.device)
            pool.keys[:, :, target] = self.pool.keys[:, :, source].to(pool.keys)
            pool.values[:, :, target] = self.pool.values[:, :, source].to(pool.values)
            if pool.hidden is not None and self.pool.hidden is not None:
                pool.hidden[:, target] = self.pool.hidden[:, source].to(pool.hidden)
            _zero_outside(pool, ids, row.start, row.end)
            for block in ids:
                pool.set_filled(int(block), pool.block_size)  # nothing appends into a copy in place
            pool.set_filled(int(ids[-1]), row.end - (ids.size - 1) * pool.block_size)
        return PagedRow(table, row.start, row.length, row.fed)

    def compact(
        self, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> Memory:
        """A copy on another device or in another dtype (in the process-wide pool for that layout)."""
        return self.to_pool(
            default_pool(self.layout.on(dtype=dtype, device=device), keep_hidden=self.keep_hidden)
        )

    def to_tensors(self) -> dict[str, Tensor]:
        """Contiguous tensors of what is held: `keys.{i}`/`values.{i}` [B, H, L, Dh], `hidden.{i}` [B, L, D]."""
        out: dict[str, Tensor] = {}
        for i in range(self.layout.n_layer):
            out[f"keys.{i}"] = self.keys(i)
            out[f"values.{i}"] = self.values(i)
        if self.keep_hidden:
            for i, h in enumerate(self.hidden_states()):
                out[f"hidden.{i}"] = h
        return out

    @classmethod
    def from_tensors(
        cls,
        layout: MemoryLayout,
        tensors: dict[str, Tensor],
        *,
        mem_len: int,
        pool: BlockPool | None = None,
        grid: int | None = None,
        fed: int | None = None,
        keep: int | None = None,
    ) -> Memory:
        """Inverse of `to_tensors`; checks every shape against the layout. Keeps at most `keep` positions (default
        `mem_len`); `fed`: the positions each row was fed over its life (default: as many as it holds)."""
        try:
            first = tensors["keys.0"]
        except KeyError as exc:
            raise ValueError("memory tensors lack 'keys.0'") from exc
        if first.dim() != 4:
            raise ValueError(f"keys.0 must be [B, H, L, Dh], got shape {tuple(first.shape)}")
        batch, _, length, _ = first.shape
        keep_hidden = "hidden.0" in tensors
        expected = {f"keys.{i}" for i in range(layout.n_layer)} | {
            f"values.{i}" for i in range(layout.n_layer)
        }
        if keep_hidden:
            expected |= {f"hidden.{i}" for i in range(layout.n_layer)}
        if set(tensors) != expected:
            missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
            raise ValueError(f"memory tensors do not match the model: missing {missing}, unexpected {extra}")
        kv_shape = (batch, layout.n_head, length, layout.d_head)
        for name, t in tensors.items():
            want = (batch, length, layout.d_model) if name.startswith("hidden.") else kv_shape
            if tuple(t.shape) != want:
                raise ValueError(f"memory tensor {name} has shape {tuple(t.shape)}, expected {want}")
        pool = pool if pool is not None else default_pool(layout, keep_hidden=keep_hidden)
        if pool.keep_hidden != keep_hidden:
            raise ValueError("the pool's hidden-state setting does not match the tensors")
        keep = min(length, mem_len if keep is None else keep)
        fed = length if fed is None else fed
        if fed < length:
            raise ValueError(f"a memory of {length} positions cannot have been fed {fed}")
        if keep == 0:
            return cls(pool, mem_len=mem_len, rows=[PagedRow(None, fed=fed)] * batch, grid=grid)
        bs = pool.block_size
        n_blocks = pool.blocks_for(keep)
        padded = n_blocks * bs

        def blocks(t: Tensor, position_dim: int) -> Tensor:
            # [..., L, ...] -> the last `keep` positions, zero-padded to whole blocks: [..., nb, bs, ...]
            t = t.narrow(position_dim, length - keep, keep).to(
                dtype=pool.layout.dtype, device=pool.keys.device
            )
            pad = list(t.shape)
            pad[position_dim] = padded - keep
            t = torch.cat([t, t.new_zeros(pad)], dim=position_dim)
            return t.unflatten(position_dim, (n_blocks, bs))

        rows: list[PagedRow] = []
        with _released_on_failure(rows):
            for b in range(batch):
                rows.append(_row_from_tensors(pool, tensors, b, blocks, keep, fed))
        return cls(pool, mem_len=mem_len, rows=rows, grid=grid)


def _row_from_tensors(
    pool: BlockPool,
    tensors: dict[str, Tensor],
    b: int,
    blocks: Callable[[Tensor, int], Tensor],
    keep: int,
    fed: int,
) -> PagedRow:
    """Row `b` of `tensors` (`Memory.from_tensors`), its last `keep` positions written into fresh blocks."""
    layout, bs = pool.layout, pool.block_size
    n_blocks = pool.blocks_for(keep)
    ids = pool.allocate(n_blocks, zero=False)  # whole blocks written below
    table = BlockTable(pool, ids, owned=True)
    with _released_on_failure([PagedRow(table)]):
        index = torch.from_numpy(ids).to(pool.keys.device)
        for i in range(layout.n_layer):
            pool.keys[i][:, index] = blocks(tensors[f"keys.{i}"][b], 1)
            pool.values[i][:, index] = blocks(tensors[f"values.{i}"][b], 1)
            if pool.hidden is not None:
                pool.hidden[i][index] = blocks(tensors[f"hidden.{i}"][b], 0)
        for block in ids:
            pool.set_filled(int(block), bs)
        pool.set_filled(int(ids[-1]), keep - (n_blocks - 1) * bs)
    return PagedRow(table, 0, keep, fed)


@contextlib.contextmanager
def _released_on_failure(rows: list[PagedRow]) -> Iterator[None]:
    """The rows made so far give their holds back if making the others fails."""
    try:
        yield
    except BaseException:
        for row in rows:
            if row.table is not None:
                row.table.release()
        raise


def _last(row: PagedRow, keep: int, pool: BlockPool) -> PagedRow:
    """The last `keep` positions of `row` (no copy: a shorter table over the same blocks), holding its table."""
    if keep >= row.length:
        if row.table is not None:
            row.table.retain()
        return row
    if keep == 0 or row.table is None:
        return PagedRow(None, fed=row.fed)
    start = row.end - keep
    drop = start // pool.block_size
    table = row.table.retain() if drop == 0 else BlockTable(pool, row.ids[drop:])
    return PagedRow(table, start - drop * pool.block_size, keep, row.fed)


def _zero_outside(pool: BlockPool, ids: np.ndarray, start: int, end: int) -> None:
    """Zeroes the positions of the copied blocks that lie outside [start, end): a copy carries nothing else."""
    bs = pool.block_size
    tail = end - (ids.size - 1) * bs
    for block, lo, hi in ((ids[0], 0, start), (ids[-1], tail, bs)):
        if hi > lo:
            pool.keys[:, :, int(block), lo:hi] = 0
            pool.values[:, :, int(block), lo:hi] = 0
            if pool.hidden is not None:
                pool.hidden[:, int(block), lo:hi] = 0


def peak_positions(mem_len: int, seg_len: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """The most positions one session's memory blocks hold while it is fed segments of `seg_len` tokens:
    what its memory can cost at worst, in whole blocks (budgets and capacity planning need this)."""
    return peak_blocks(mem_len, seg_len, block_size) * block_size


@dataclass(frozen=True)
class HiddenMemory:
    """The paper's memory: per layer, detached layer inputs [B, L, d_model] of the last <= mem_len positions.

    Each step re-projects it with the current weights, so gradients reach the key/value projections through the
    memory positions too (but not the hidden states themselves: they are constants). Used for training.
    """

    hidden: tuple[Tensor, ...]
    mem_len: int
    batch_size: int

    @classmethod
    def empty(
        cls, n_layer: int, batch_size: int, d_model: int, mem_len: int, *, like: Tensor
    ) -> HiddenMemory:
        block = like.new_zeros(batch_size, 0, d_model)
        return cls(tuple(block for _ in range(n_layer)), mem_len, batch_size)

    @property
    def length(self) -> int:
        return self.hidden[0].size(1)

    def writer(self, seg_len: int) -> _HiddenWriter:
        return _HiddenWriter(self, seg_len)


class _HiddenWriter:
    def __init__(self, memory: HiddenMemory, seg_len: int) -> None:
        self.memory = memory
        self.seg_len = seg_len
        self.inputs: list[Tensor] = []

    @property
    def mem_length(self) -> int:
        return self.memory.length

    def extend(
        self, layer: int, keys: Tensor, values: Tensor, layer_input: LayerInput, project_kv: ProjectKV
    ) -> tuple[Tensor, Tensor]:
        self.inputs.append(layer_input())
        past = self.memory.hidden[layer]
        if past.size(1) == 0:
            return keys, values
        past_keys, past_values = project_kv(past)
        return torch.cat([past_keys, keys], dim=2), torch.cat([past_values, values], dim=2)

    def finish(self) -> HiddenMemory:
        m = self.memory
        with torch.no_grad():
            hidden = tuple(
                torch.cat([past, new.detach()], dim=1)[:, -m.mem_len :] if m.mem_len else past[:, :0]
                for past, new in zip(m.hidden, self.inputs, strict=True)
            )
        return HiddenMemory(hidden, m.mem_len, m.batch_size)
