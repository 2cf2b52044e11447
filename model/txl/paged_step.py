"""One forward over many sequences with paged memories: what every layer needs to know, computed once.

Rows may hold memories of any length and feed any number of new tokens. Tokens of all rows are packed into one
flat sequence [N] for the embedding, the projections and the feed-forward layers. Attention runs once per group
of rows that feed the same number of tokens (all decoding rows together; prompt segments of equal length
together), over the blocks of each row.

Relative positions. Query i of a row sits at offset p = start + mem_length + i of its block table; key slot j
is at distance d = p - j. The positional term BD for that pair is (q + v) . W_r R[d]: computed for every
distance at once (one product against the positional table, columns for distances P-1..0), then picked per
slot with `bd_index` = P-1-d. Slots outside the row's window (before its first position, after the query, or
beyond `mem_len` with same_length) are masked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .paged import NULL_BLOCK, BlockPool, PagedRow, Reservation, RowStep, plan_row


@dataclass(frozen=True)
class QueryGroup:
    """Rows feeding `queries` tokens each, attended in one computation."""

    queries: int  # T: new tokens per row
    token_index: Tensor  # [B*T] long: each query's index in the step's flat tokens, row-major
    table: Tensor  # [B, S] long: block ids, padded with the null block
    head_rows: Tensor  # [H*B*S] long: rows of a layer's pool viewed as [H*n_blocks, bs*Dh], head-major
    bd_index: (
        Tensor  # [B, T, L] long: column of the positional scores for (query, key slot); L = S*block_size
    )
    mask: Tensor  # [B, T, L] bool: True where a key slot is hidden from a query
    starts: Tensor  # [B] long: offset of each row's first position in its first block
    key_lengths: Tensor  # [B] long: positions each row's last query sees (memory + new)
    windows: Tensor  # [B] long: same_length window (mem_len, at least 1), or a bound no distance reaches

    @property
    def rows(self) -> int:
        return self.table.size(0)

    @property
    def key_slots(self) -> int:
        return self.mask.size(-1)


class PagedStep:
    """The plan of one forward: where each new token's keys and values go, and the query groups."""

    def __init__(
        self,
        pool: BlockPool,
        rows: Sequence[PagedRow],
        queries: Sequence[int],
        mem_lens: Sequence[int],
        *,
        same_length: bool,
        reservation: Reservation | None = None,
    ) -> None:
        if not rows:
            raise ValueError("a step needs at least one row")
        if any(q < 1 for q in queries):
            raise ValueError("every row of a step needs at least one token")
        self.pool = pool
        device = pool.layout.device
        bs = pool.block_size
        self.row_steps: list[RowStep] = [
            plan_row(pool, row, q, mem_len, reservation)
            for row, q, mem_len in zip(rows, queries, mem_lens, strict=True)
        ]
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
            self._group(members, q, offsets, mem_lens, same_length) for q, members in by_size.items()
        ]

    @property
    def results(self) -> list[PagedRow]:
        """Each row's memory after the step."""
        return [rs.result for rs in self.row_steps]

    def _group(
        self,
        members: list[int],
        queries: int,
        offsets: np.ndarray,
        mem_lens: Sequence[int],
        same_length: bool,
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
        # A window of 0 would hide every key; as in the single-sequence mask it is taken as 1.
        windows = np.array(
            [max(mem_lens[r], 1) if same_length else self.n_pos + 1 for r in members], dtype=np.int64
        )
        starts_t, lengths_t, windows_t = (_index(a, device) for a in (starts, key_lengths, windows))
        slots = width * bs
        query = torch.arange(queries, device=device)[None, :, None]  # [1, T, 1]
        key = torch.arange(slots, device=device)[None, None, :]  # [1, 1, L]
        # The first query sees the memory and itself: it sits at start + key_length - T.
        position = (starts_t + lengths_t - queries)[:, None, None] + query  # [B, T, 1]
        distance = position - key  # [B, T, L]
        hidden = (key < starts_t[:, None, None]) | (distance < 0) | (distance >= windows_t[:, None, None])
        bd_index = (self.n_pos - 1 - distance).clamp(0, self.n_pos - 1)
        # index_select along the first dimension copies whole contiguous rows (blocks of one head) at full
        # bandwidth; along the blocks dimension of [H, n_blocks, bs, Dh] it was 5x slower.
        heads = self.pool.layout.n_head
        head_rows = np.arange(heads)[:, None] * self.pool.n_blocks + table.reshape(1, -1)  # [H, B*S]
        return QueryGroup(
            queries,
            _index(token_index, device),
            _index(table, device),
            _index(head_rows.reshape(-1), device),
            bd_index,
            hidden,
            starts_t,
            lengths_t,
            windows_t,
        )

    def write(self, layer: int, keys: Tensor, values: Tensor, layer_input: Tensor | None) -> None:
        """Stores this layer's keys/values [N, H, Dh] (and input [N, D]) of the new positions in the pool."""
        pool = self.pool
        pool.keys[layer][:, self.write_blocks, self.write_slots] = keys.transpose(0, 1)
        pool.values[layer][:, self.write_blocks, self.write_slots] = values.transpose(0, 1)
        if pool.hidden is not None and layer_input is not None:
            pool.hidden[layer][self.write_blocks, self.write_slots] = layer_input


def _index(array: np.ndarray, device: torch.device) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device, non_blocking=True)
