"""One forward over many sequences with paged memories: what every layer needs to know, computed once.

Rows may hold memories of any length and feed any number of new tokens. Tokens of all rows are packed into one
flat sequence [N] for the embedding, the projections and the feed-forward layers. Attention runs once per group
of rows that feed the same number of tokens (all decoding rows together; prompt segments of equal length
together), over the blocks of each row.

Relative positions. Query i of a row sits at offset p = start + mem_length + i of its block table; key slot j
is at distance d = p - j. The positional term BD for that pair is (q + v) . W_r R[d]: computed for every
distance at once (one product against the positional table, columns for distances P-1..0), then picked per
slot with `bd_index` = P-1-d. Slots outside the query's window (before the row's first position, after the
query, or at a distance its `txl.window.WindowRule` hides) are masked.

`PagedStep` plans one such forward from the rows' memories; `StaticDecodeStep` is a decoding step whose inputs
sit in buffers that never move (what a CUDA graph captures). Both are `GroupedStep`s: what the layers read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..window import WindowRule
from .decode_plan import DecodePlan
from .pool import NULL_BLOCK, BlockPool, Reservation
from .rows import PagedRow, RowStep, plan_row
from .staging import StagedInputs

# Attention scores of one query group on CPU: about an L2 cache's worth (see PagedStep._tiles).
CPU_SCORE_BYTES = 1 << 20


@dataclass(frozen=True)
class GroupIndices:
    """Index tensors the torch attention path derives from a group's per-row inputs."""

    head_rows: Tensor  # [H*B*S] long: rows of a layer's pool viewed as [H*n_blocks, bs*Dh], head-major
    mask: Tensor  # [B, T, L] bool: True where a key slot is hidden from a query
    bd_index: Tensor  # [B, T, L] long: the column of the positional scores for each (query, key slot)


@dataclass(frozen=True)
class QueryGroup:
    """Rows feeding `queries` tokens each, attended in one computation: the per-row inputs, as device tensors."""

    queries: int  # T: new tokens per row
    token_index: Tensor  # [B*T] long: each query's index in the step's flat tokens, row-major
    table: Tensor  # [B, S] long: block ids, padded with the null block
    starts: Tensor  # [B] long: offset of each row's first position in its first block
    key_lengths: Tensor  # [B] long: positions each row's last query sees (memory + new)
    windows: Tensor  # [B, T] long: each query sees keys at distance < its window (txl.window)
    n_pos: int  # P: distances the positional scores cover
    block_size: int
    n_head: int
    n_blocks: int  # blocks in the pool (rows of a layer's [H*n_blocks, bs*Dh] view per head)
    # Each row's first query's position in its table, when the host knows it (not for a graph's buffers).
    first_query_positions: list[int] | None = None

    @property
    def rows(self) -> int:
        return self.table.size(0)

    @property
    def key_slots(self) -> int:
        return self.table.size(1) * self.block_size

    def derive(self) -> GroupIndices:
        """The torch path's index tensors, computed now from the inputs' current values. Never cached on the
        group: a CUDA graph captures this computation, so that each replay derives them from the buffers it
        was given (indices computed once, at capture, would keep pointing at the warm-up's rows)."""
        device = self.table.device
        # index_select along the first dimension copies whole contiguous rows (a block of one head) at full
        # bandwidth; along the blocks dimension of [H, n_blocks, bs, Dh] it was several times slower.
        heads = torch.arange(self.n_head, device=device)[:, None] * self.n_blocks
        head_rows = (heads + self.table.reshape(1, -1)).reshape(-1)  # [H*B*S]
        query = torch.arange(self.queries, device=device)[None, :, None]  # [1, T, 1]
        key = torch.arange(self.key_slots, device=device)[None, None, :]  # [1, 1, L]
        # The first query sees the memory and itself: it sits at start + key_length - T.
        position = (self.starts + self.key_lengths - self.queries)[:, None, None] + query  # [B, T, 1]
        distance = position - key  # [B, T, L]; negative: after the query
        mask = (key < self.starts[:, None, None]) | (distance < 0) | (distance >= self.windows[:, :, None])
        bd_index = (self.n_pos - 1 - distance).clamp(0, self.n_pos - 1)
        return GroupIndices(head_rows, mask, bd_index)


class GroupedStep:
    """What every step gives the layers: the pool, where each new token's keys and values go (`write_blocks`,
    `write_slots` [N]), the query groups, and each group's index tensors for the torch path (`indices`)."""

    pool: BlockPool
    n_pos: int  # distances the positional scores cover
    write_blocks: Tensor
    write_slots: Tensor
    groups: list[QueryGroup]
    _indices: dict[int, GroupIndices]

    def begin(self) -> None:
        """A forward over this step starts."""

    def indices(self, group: int) -> GroupIndices:
        """Group `group`'s index tensors for the torch attention path, derived on first use in a forward."""
        found = self._indices.get(group)
        if found is None:
            found = self._indices[group] = self.groups[group].derive()
        return found

    def write(self, layer: int, keys: Tensor, values: Tensor, layer_input: Tensor | None) -> None:
        """Stores this layer's keys/values [N, H, Dh] (and input [N, D]) of the new positions in the pool."""
        _write(self.pool, self.write_blocks, self.write_slots, layer, keys, values, layer_input)


class PagedStep(GroupedStep):
    """The plan of one forward: where each new token's keys and values go, and the query groups. Its groups'
    inputs never change, so their index tensors are derived once, in its first forward."""

    def __init__(
        self,
        pool: BlockPool,
        rows: Sequence[PagedRow],
        queries: Sequence[int],
        rules: Sequence[WindowRule],
        *,
        reservation: Reservation | None = None,
    ) -> None:
        if not rows:
            raise ValueError("a step needs at least one row")
        if any(q < 1 for q in queries):
            raise ValueError("every row of a step needs at least one token")
        self.pool = pool
        device = pool.layout.device
        bs = pool.block_size
        self.row_steps: list[RowStep] = []
        try:
            with pool.zeroing_together():
                for row, q, rule in zip(rows, queries, rules, strict=True):
                    self.row_steps.append(plan_row(pool, row, q, rule.keep(row.fed + q), reservation))
        except BaseException:
            self.release(results=True)  # what the rows planned so far took goes back at once
            raise
        offsets = np.cumsum([0, *queries])
        self.n_tokens = int(offsets[-1])
        self.token_offsets = offsets  # row r's tokens are [offsets[r], offsets[r + 1])
        blocks, slots = [], []
        for rs in self.row_steps:
            positions = rs.write_positions
            blocks.append(rs.ids[positions // bs])
            slots.append(positions % bs)
        self.write_blocks = _index(np.concatenate(blocks), device)  # [N]
        self.write_slots = _index(np.concatenate(slots), device)  # [N]
        # Distances the positional table must cover: the longest window any query sees.
        self.n_pos = max(rs.mem_length + rs.new for rs in self.row_steps)
        by_size: dict[int, list[int]] = {}
        for r, q in enumerate(queries):
            by_size.setdefault(q, []).append(r)
        self.groups = [
            self._group(part, q, offsets, rules)
            for q, members in by_size.items()
            for part in self._tiles(members, q, device)
        ]
        self._indices: dict[int, GroupIndices] = {}

    def _tiles(self, members: list[int], queries: int, device: torch.device) -> list[list[int]]:
        """Splits a group on CPU so that each part's attention scores [H, B, T, L] stay within CPU_SCORE_BYTES:
        the scores are written, masked, normalised and read back, and beyond the cache those passes run at memory
        speed (`python -m bench batching` measures a group whole, in parts and one by one: docs/benchmarks/
        batching.md). A GPU takes the group whole: its scores never leave for host memory, and fewer launches
        count."""
        if device.type != "cpu" or queries == 1 or len(members) == 1:
            return [members]  # decoding rows: a query's scores are one row of keys, never a large tensor
        bs = self.pool.block_size
        widest = max(self.row_steps[r].ids.size for r in members) * bs
        per_row = self.pool.layout.n_head * queries * widest * 4  # bytes of float32 scores
        rows = max(1, CPU_SCORE_BYTES // per_row)
        return [members[i : i + rows] for i in range(0, len(members), rows)]

    @property
    def results(self) -> list[PagedRow]:
        """Each row's memory after the step, each holding its table once (for the caller, once the step ran)."""
        return [rs.result for rs in self.row_steps]

    def release(self, *, results: bool = False) -> None:
        """The step's holds on its tables go (after its forward ran); with `results`, the results' holds too (a
        step that failed: nobody takes them)."""
        steps, self.row_steps = self.row_steps, []
        for rs in steps:
            rs.release(result=results)

    def _group(
        self, members: list[int], queries: int, offsets: np.ndarray, rules: Sequence[WindowRule]
    ) -> QueryGroup:
        device = self.pool.layout.device
        bs = self.pool.block_size
        steps = [self.row_steps[r] for r in members]
        width = max(rs.ids.size for rs in steps)
        table = np.full((len(steps), width), NULL_BLOCK, dtype=np.int64)
        for i, rs in enumerate(steps):
            table[i, : rs.ids.size] = rs.ids
        token_index = np.concatenate([np.arange(offsets[r], offsets[r] + queries) for r in members])
        starts = np.array([rs.start for rs in steps], dtype=np.int64)
        key_lengths = np.array([rs.mem_length + rs.new for rs in steps], dtype=np.int64)
        # No window need reach beyond the positional scores: n_pos + 1 stands for "unbounded".
        windows = np.array(
            [
                [min(rules[r].window(rs.position + t), self.n_pos + 1) for t in range(queries)]
                for r, rs in zip(members, steps, strict=True)
            ],
            dtype=np.int64,
        )
        return QueryGroup(
            queries,
            _index(token_index, device),
            _index(table, device),
            _index(starts, device),
            _index(key_lengths, device),
            _index(windows, device),
            self.n_pos,
            bs,
            self.pool.layout.n_head,
            self.pool.n_blocks,
            (starts + key_lengths - queries).tolist(),
        )


class StaticDecodeStep(GroupedStep):
    """A decoding step (one new token per row) whose inputs live in buffers that never move: what a CUDA graph
    captures. `load` fills them for the rows of one iteration (one non-blocking copy from the host, see
    txl.paged.staging); rows beyond those are padding, which read and write only `scratch_block` (a block no memory
    holds). Everything derived from the buffers is derived inside the forward (`begin`, `indices`), so that a
    captured graph derives it again from each replay's rows."""

    def __init__(
        self,
        pool: BlockPool,
        *,
        rows: int,
        max_blocks: int,
        n_pos: int,
        scratch_block: int,
    ) -> None:
        device = pool.layout.device
        self.pool = pool
        self.capacity = rows
        self.max_blocks = max_blocks
        self.n_pos = n_pos
        self.scratch_block = scratch_block
        self.plan: DecodePlan | None = None  # the rows loaded: their tables are held until the next load
        # Per host buffer (txl.paged.staging), the first row from which it holds padding (rows + 1: not written yet).
        self._padding_from = [rows + 1, rows + 1]
        self._inputs = StagedInputs(
            {
                "write_blocks": (rows,),
                "write_slots": (rows,),
                "key_lengths": (rows,),
                "windows": (rows, 1),
                "starts": (rows,),
                "table": (rows, max_blocks),
            },
            torch.long,
            device,
        )
        self.write_blocks = self._inputs.view("write_blocks")
        self.write_slots = self._inputs.view("write_slots")
        group = QueryGroup(
            1,
            torch.arange(rows, device=device),
            self._inputs.view("table"),
            self._inputs.view("starts"),
            self._inputs.view("key_lengths"),
            self._inputs.view("windows"),
            n_pos,
            pool.block_size,
            pool.layout.n_head,
            pool.n_blocks,
        )
        self.groups = [group]
        self._columns = np.arange(max_blocks)  # [max_blocks]
        self._indices: dict[int, GroupIndices] = {}
        self.load(None)  # every row padding until the first iteration

    def load(self, plan: DecodePlan | None, windows: np.ndarray | None = None) -> None:
        """The rows of this iteration (`txl.paged.decode_plan`), each query seeing keys at distance < `windows[i]`
        (`txl.window.windows_at`), padded to capacity; None: every row padding."""
        n = len(plan) if plan is not None else 0
        if n > self.capacity:
            raise ValueError(f"{n} rows do not fit a step of {self.capacity}")
        host, turn = self._inputs.host(), self._inputs.turn
        if self._padding_from[turn] > n:  # rows from n on are not all padding in this host buffer yet
            # Padding: write slot 0 of the scratch block, read only it.
            host["write_blocks"][n:] = self.scratch_block
            host["write_slots"][n:] = 0
            host["key_lengths"][n:] = 1
            host["windows"][n:] = 1
            host["starts"][n:] = 0
            host["table"][n:] = self.scratch_block
        self._padding_from[turn] = n
        if plan is not None and n:
            assert windows is not None
            widths = plan.widths
            if widths.max() > self.max_blocks or plan.key_lengths.max() > self.n_pos:
                raise ValueError("a row longer than the step was built for runs eagerly")
            host["write_blocks"][:n] = plan.write_blocks
            host["write_slots"][:n] = plan.write_slots
            host["key_lengths"][:n] = plan.key_lengths
            np.minimum(windows, self.n_pos + 1, out=host["windows"][:n, 0])
            host["starts"][:n] = plan.starts
            table = host["table"][:n]  # [n, max_blocks]
            table[:] = NULL_BLOCK
            # Row i's ids fill its first widths[i] columns: a mask's True entries, row by row, are the flat ids'
            # order (4 array operations where indices built from cumulative widths took 8).
            table[self._columns < widths[:, None]] = plan.flat_ids
        self._inputs.send()
        self.plan = plan

    def begin(self) -> None:
        """A forward starts: what was derived from the previous rows is dropped (inside a captured graph this runs
        once, at capture, and the derivation it leads to is replayed from the buffers each time)."""
        self._indices = {}


def _write(
    pool: BlockPool,
    blocks: Tensor,
    slots: Tensor,
    layer: int,
    keys: Tensor,
    values: Tensor,
    layer_input: Tensor | None,
) -> None:
    pool.keys[layer][:, blocks, slots] = keys.transpose(0, 1)
    pool.values[layer][:, blocks, slots] = values.transpose(0, 1)
    if pool.hidden is not None and layer_input is not None:
        pool.hidden[layer][blocks, slots] = layer_input


def _index(array: np.ndarray, device: torch.device) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device, non_blocking=True)
