"""Decoding attention on the CPU: one query per row over its memory's blocks, read in place (`paged_decode.c`).

Why native code: decoding attends one query per row over every row's memory, which lives in pool blocks. In
plain torch that means gathering each row's blocks into a dense copy first (index_select), then two products:
the copy alone moves twice the bytes attention needs. The kernel reads each block in place, once. With more than
one torch thread a call splits its (row, head) items over torch's own OpenMP team (see the C file).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from ..decode_rows import DecodeRows
from .build import KernelByDtype, load_kernel

SOURCE = Path(__file__).with_name("paged_decode.c")
# q .. out; B, H, S, NB, bs, Dh, P, threads; scratch, its floats per thread
_ARGS = [ctypes.c_void_p] * 9 + [ctypes.c_int64] * 8 + [ctypes.c_void_p, ctypes.c_int64]
# (row, head) items a thread takes at least: fewer cost more to hand out than they save.
ITEMS_PER_THREAD = 4


class PagedDecodeKernel(KernelByDtype):
    """Attention of one query per row over paged keys/values (see paged_decode.c for the contract)."""

    ENTRY = "txl_paged_decode_{}_threads"
    ARGS = _ARGS

    def __call__(self, q: Tensor, bd: Tensor, keys: Tensor, values: Tensor, rows: DecodeRows) -> Tensor:
        """q [B, H, Dh] float32, bd [H, B, P] float32, keys/values [H, NB, bs, Dh] -> [B, H, Dh] float32."""
        table, starts, key_lengths, windows = rows.table, rows.starts, rows.key_lengths, rows.windows
        batch, heads, d_head = q.shape
        _, n_blocks, block_size, _ = keys.shape
        width, n_pos = table.size(1), bd.size(2)
        q, bd, table = q.contiguous(), bd.contiguous(), table.contiguous()
        out = torch.empty_like(q)
        threads = self.library.team(batch * heads // ITEMS_PER_THREAD)
        scratch = torch.empty(threads, width * block_size)
        pointers = [t.data_ptr() for t in (q, bd, keys, values, table, starts, key_lengths, windows, out)]
        sizes = [batch, heads, width, n_blocks, block_size, d_head, n_pos]
        self.functions[keys.dtype](*pointers, *sizes, threads, scratch.data_ptr(), width * block_size)
        return out


@functools.cache
def cpu_paged_decode() -> PagedDecodeKernel | None:
    """The kernel for this machine, built on first use; None where it cannot be (attention then uses torch)."""
    return load_kernel(SOURCE, PagedDecodeKernel, openmp=True)
