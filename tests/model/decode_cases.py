"""Random inputs for a decoding kernel (one query per row over a paged pool) and the dense torch computation of
what it must return, in float64. Shared by the CPU kernel's tests and the Triton kernel's interpreted run."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Rows:
    """A `txl.kernels.DecodeRows`: block tables, first offsets, key lengths, windows."""

    table: Tensor  # [B, S] long
    starts: Tensor  # [B] long
    key_lengths: Tensor  # [B] long
    windows: Tensor  # [B] or [B, 1] long


@dataclass(frozen=True)
class Case:
    q: Tensor  # [B, H, Dh] float32
    bd: Tensor  # [H, B, P] float32
    keys: Tensor  # [H, NB, bs, Dh]
    values: Tensor
    rows: Rows

    def describe(self) -> str:
        lengths = self.rows.key_lengths.tolist()
        windows = self.rows.windows.reshape(-1).tolist()
        return (
            f"dtype {self.keys.dtype} bs {self.keys.size(2)} d_head {self.q.size(2)} key lengths {lengths} "
            f"windows {windows} starts {self.rows.starts.tolist()} P {self.bd.size(2)}"
        )


def random_case(
    rng: random.Random, *, dtype: torch.dtype, block_size: int, d_head: int, heads: int = 2, long: int = 0
) -> Case:
    """Rows of different lengths (memory 0 and 1, block boundaries, random, and `long` keys if given), each
    starting anywhere in its first block, on shuffled blocks, with windows shorter than the memory for some."""
    bs = block_size
    lengths = rng.sample([1, 2, bs, bs + 1, 2 * bs + 1, rng.randint(1, 6 * bs)], k=rng.randint(2, 4))
    if long:  # memory + the query
        lengths.append(long)
    starts = [rng.randint(0, bs - 1) for _ in lengths]
    n_blocks = sum(math.ceil((s + n) / bs) for s, n in zip(starts, lengths, strict=True)) + 4
    free = list(range(1, n_blocks))
    rng.shuffle(free)  # a row's blocks anywhere in the pool, in any order
    tables = [
        [free.pop() for _ in range(math.ceil((s + n) / bs))] for s, n in zip(starts, lengths, strict=True)
    ]
    width = max(map(len, tables)) + rng.randint(0, 2)  # padded as a graph's table is
    table = torch.zeros(len(lengths), width, dtype=torch.long)  # padding: the null block 0
    for b, ids in enumerate(tables):
        table[b, : len(ids)] = torch.tensor(ids)
    n_pos = max(lengths) + rng.choice([0, 0, 5])
    # A window per row: unbounded (n_pos + 1), or shorter than the memory (same_length, the grid rule).
    windows = [n_pos + 1 if rng.random() < 0.4 else rng.randint(1, n + 1) for n in lengths]
    window_tensor = torch.tensor(windows)
    if rng.random() < 0.5:
        window_tensor = window_tensor[:, None]  # [B, T] with T = 1, as query groups hold them
    generator = torch.Generator().manual_seed(rng.randint(0, 2**31))
    shape = (heads, n_blocks, bs, d_head)
    return Case(
        torch.randn(len(lengths), heads, d_head, generator=generator),
        torch.randn(heads, len(lengths), n_pos, generator=generator),
        torch.randn(shape, generator=generator).to(dtype),
        torch.randn(shape, generator=generator).to(dtype),
        Rows(table, torch.tensor(starts), torch.tensor(lengths), window_tensor),
    )


def dense_reference(case: Case) -> Tensor:
    """The kernel's contract in plain torch, float64: gather each row's visible keys, softmax, weighted values."""
    q, bd, keys, values, rows = case.q, case.bd, case.keys, case.values, case.rows
    batch, heads, d_head = q.shape
    bs, n_pos = keys.size(2), bd.size(2)
    windows = rows.windows.reshape(-1)
    out = torch.zeros(batch, heads, d_head, dtype=torch.float64)
    for b in range(batch):
        start, length, window = int(rows.starts[b]), int(rows.key_lengths[b]), int(windows[b])
        p = start + length - 1  # the query's position in its table
        j = torch.arange(max(start, p - window + 1), p + 1)  # the keys it sees
        blocks, slots = rows.table[b, j // bs], j % bs
        for h in range(heads):
            k = keys[h, blocks, slots].double()  # [n, Dh]
            v = values[h, blocks, slots].double()
            score = k @ q[b, h].double() + bd[h, b, n_pos - 1 - (p - j)].double()  # [n]
            out[b, h] = torch.softmax(score, 0) @ v
    return out
