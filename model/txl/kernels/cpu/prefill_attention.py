"""Attention of a prompt segment's queries in one native call per layer (`prefill_attention.c`), float32 on the CPU.

Why: a prompt segment's attention on a CPU spends much of its time in torch's three attention products a layer
(content, positional, values), which run at MKL's float32 rate: on CPUs where MKL runs AVX2 code, well below what
the CPU can do. The register-tiled loops of the call, built with -march=native, run them as fast as oneDNN's
packed products (docs/model.md). Between them the call makes one pass per query where torch made four over the
[H, T, L] scores (copying the shifted positional scores, adding them, masking, the softmax), gathers only the
slots some query sees, and skips the tiles of the products that no query sees.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from ..decode_rows import DecodeRows
from .build import Kernel, LoadedLibrary, load_kernel

SOURCE = Path(__file__).with_name("prefill_attention.c")
# qc .. pos; the positional heads' stride; out; H, B, T, Dh, S, NB, bs, P, threads; scratch, its floats per thread
_ARGS = [ctypes.c_void_p] * 10 + [ctypes.c_int64] + [ctypes.c_void_p] + [ctypes.c_int64] * 9
_ARGS += [ctypes.c_void_p, ctypes.c_int64]


class PrefillRows(DecodeRows, Protocol):
    """What the call reads of a query group besides the pool: its rows' tables and windows [B, T], and each query's
    token (`txl.paged.step.QueryGroup` is one)."""

    @property
    def token_index(self) -> Tensor: ...


class PrefillAttentionKernel(Kernel):
    """Relative attention of a query group over its rows' blocks (see prefill_attention.c for the contract)."""

    def __init__(self, library: LoadedLibrary) -> None:
        super().__init__(library)
        self._function = library.function("txl_prefill_attention_f32_threads", _ARGS)
        self._scratch_floats = library.function(
            "txl_prefill_scratch_floats", [ctypes.c_int64] * 4, ctypes.c_int64
        )
        # One scratch buffer per thread, kept between calls: the call needs no particular contents in it.
        self._local = threading.local()

    def _scratch(self, floats: int) -> Tensor:
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or buffer.numel() < floats:
            buffer = self._local.buffer = torch.empty(floats)
        return buffer

    def __call__(
        self,
        q_content: Tensor,
        q_position: Tensor,
        keys: Tensor,
        values: Tensor,
        positions: Tensor,
        rows: PrefillRows,
        queries: int,
    ) -> Tensor:
        """q_content, q_position [N, H, Dh] float32 (biased and scaled); keys, values: a layer's pool
        [H, NB, bs, Dh] float32; positions [H, P, Dh]: positional keys for distances P-1..0 -> [B*T, H, Dh],
        each query's attention output in the group's token order."""
        tensors = (q_content, q_position, keys, values, positions)
        if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
            raise ValueError("prefill attention: float32 tensors on the CPU only")
        heads, n_blocks, block_size, d_head = keys.shape
        table = rows.table
        batch, width = table.shape
        n_pos = positions.size(1)
        q_content, q_position = q_content.contiguous(), q_position.contiguous()
        if positions.stride(2) != 1 or positions.stride(1) != d_head:
            positions = positions.contiguous()  # each head's [P, Dh] rows in one piece; heads may lie apart
        out = q_content.new_empty(batch * queries, heads, d_head)
        threads = self.library.team(heads * batch)
        per_thread = self._scratch_floats(queries, d_head, width * block_size, n_pos)
        scratch = self._scratch(threads * per_thread)
        inputs = [q_content, q_position, rows.token_index, keys, values, table, rows.starts, rows.key_lengths]
        pointers = [t.data_ptr() for t in (*inputs, rows.windows.contiguous(), positions)]
        self._function(
            *pointers,
            positions.stride(0),
            out.data_ptr(),
            heads,
            batch,
            queries,
            d_head,
            width,
            n_blocks,
            block_size,
            n_pos,
            threads,
            scratch.data_ptr(),
            per_thread,
        )
        return out


@functools.cache
def cpu_prefill_attention() -> PrefillAttentionKernel | None:
    """The kernel for this machine, built on first use; None where it cannot be (attention then uses torch)."""
    return load_kernel(SOURCE, PrefillAttentionKernel, openmp=True)
