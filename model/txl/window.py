"""Which keys each query attends to, and how many positions a memory keeps between steps.

Transformer-XL's output depends on how its input was cut into segments. In the paper's training and in HF's
`TransfoXLLMHeadModel`, a query sees the whole memory its segment was given plus the segment's earlier positions,
so a query's window depends on where its segment happened to start: the same text fed as one piece, or as two
pieces cut elsewhere, gives different log-probabilities (docs/model.md says by how much). A
server receives a session's text in pieces of every size (a create, appends, one sampled token at a time, a fork),
so it fixes every query's window by the query's absolute position instead (`WindowRule.grid`):

    a query at position p (counted from the session's first token) sees the keys from
    floor(p / grid) * grid - mem_len to p,

which is exactly what it sees when the text is fed in segments of `grid` tokens from the start, the paper's own
evaluation setting. Then every position's keys and values, and so the memory, are a function of the tokens alone,
however they arrived. The price is memory: between steps a memory keeps `mem_len + fed % grid` positions, up to
`grid - 1` more than `mem_len`.

Models trained with `same_length` already see a fixed window (every query sees its last `mem_len` positions), a
function of the position alone; the grid does not apply to them. With `grid=None` windows follow the segments as
fed (HF's function, which the parity tests check).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

# A window no distance reaches: the query sees its whole memory and its segment's earlier positions.
UNBOUNDED = 1 << 62


@functools.cache
def window_rule(mem_len: int, same_length: bool, grid: int | None) -> WindowRule:
    """The rule for these parameters, made once (a decoding step asks for every row's)."""
    return WindowRule(mem_len, same_length, grid)


@dataclass(frozen=True, slots=True)
class WindowRule:
    mem_len: int
    same_length: bool = False
    grid: int | None = None  # the segment grid windows are fixed on (None: they follow the segments as fed)

    def __post_init__(self) -> None:
        if self.mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {self.mem_len}")
        if self.grid is not None and self.grid < 1:
            raise ValueError(f"grid must be >= 1, got {self.grid}")

    @property
    def on_grid(self) -> bool:
        return self.grid is not None and not self.same_length

    def window(self, position: int) -> int:
        """How far back a query at absolute `position` sees: keys at distance < window (itself at distance 0)."""
        if self.same_length:
            return max(self.mem_len, 1)  # a window of 0 would hide the query from itself
        if self.grid is None:
            return UNBOUNDED
        return self.mem_len + position % self.grid + 1

    def keep(self, fed: int) -> int:
        """The most positions a memory keeps after `fed` tokens: what the next query's window can reach."""
        if self.on_grid:
            assert self.grid is not None
            return min(fed, self.mem_len + fed % self.grid)
        return min(fed, self.mem_len)

    @property
    def max_positions(self) -> int:
        """The most positions a memory following this rule holds between steps."""
        if self.on_grid:
            assert self.grid is not None
            return self.mem_len + self.grid - 1
        return self.mem_len


def keeps_after(
    mem_lens: np.ndarray | int, grids: np.ndarray | int, same_length: bool, fed: np.ndarray
) -> np.ndarray:
    """`WindowRule.keep(fed)` for many rows at once: row i follows WindowRule(mem_lens[i], same_length, grids[i]),
    a grid of 0 standing for none. Integers: one rule for every row (a batch's usual case, in fewer operations)."""
    if isinstance(mem_lens, int) and isinstance(grids, int):
        if grids and not same_length:
            return np.minimum(fed, fed % grids + mem_lens)
        return np.minimum(fed, mem_lens)
    on_grid = (grids > 0) & (not same_length)
    grown = np.where(on_grid, fed % np.maximum(grids, 1), 0)
    return np.minimum(fed, mem_lens + grown)


def windows_at(
    mem_lens: np.ndarray | int, grids: np.ndarray | int, same_length: bool, positions: np.ndarray
) -> np.ndarray:
    """`WindowRule.window(position)` for many rows at once (grids and integers as in `keeps_after`)."""
    if isinstance(mem_lens, int) and isinstance(grids, int):
        if same_length:
            return np.full(positions.shape, max(mem_lens, 1), dtype=np.int64)
        if grids:
            return positions % grids + (mem_lens + 1)
        return np.full(positions.shape, UNBOUNDED, dtype=np.int64)
    if same_length:
        return np.maximum(mem_lens, 1)
    on_grid = mem_lens + positions % np.maximum(grids, 1) + 1
    return np.where(grids > 0, on_grid, UNBOUNDED)
