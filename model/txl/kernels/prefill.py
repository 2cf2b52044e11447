"""Attention probabilities of a prompt segment in one native pass (`prefill_softmax.c`), float32 on the CPU.

Why: for a 128-token segment over a memory of 512, the torch path makes four passes over the [H, T, L] scores,
each larger than the L2 cache: it copies the shifted positional scores into the output of the content product
(`baddbmm`'s input), adds them, masks the hidden slots and takes the softmax. The pass here reads each visible
score once with its positional score and writes the probability; the hidden slots it only zeroes. Both products
stay torch's (blocked GEMMs).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from .cpu import build_library
from .rows import DecodeRows

SOURCE = Path(__file__).with_name("prefill_softmax.c")
_ARGS = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 6


class PrefillSoftmaxKernel:
    """In place: content scores -> probabilities of a query group (see prefill_softmax.c for the contract)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._function = library.txl_prefill_softmax_f32
        self._function.argtypes = _ARGS
        self._function.restype = None

    def __call__(self, score: Tensor, by_distance: Tensor, rows: DecodeRows, queries: int) -> None:
        """score [H, B, T, L] float32 contiguous (AC in, probabilities out); by_distance [H, B*T, P] float32
        contiguous: each query's positional scores for distances P-1..0."""
        heads, batch, qlen, slots = score.shape
        if qlen != queries or not (score.is_contiguous() and by_distance.is_contiguous()):
            raise ValueError("prefill softmax: scores [H, B, T, L] and positional scores must be contiguous")
        if score.dtype != torch.float32 or by_distance.dtype != torch.float32:
            raise ValueError("prefill softmax: float32 only")
        n_pos = by_distance.size(2)
        starts, key_lengths, windows = rows.starts, rows.key_lengths, rows.windows.contiguous()
        pointers = [t.data_ptr() for t in (score, by_distance, starts, key_lengths, windows)]
        # One call on one thread: split across Python threads, the bundled model's segment took 7% longer at 2
        # threads (torch's own threads spin between its operations, beside them).
        self._function(*pointers, batch, qlen, slots, n_pos, 0, heads * batch * qlen)


@functools.cache
def cpu_prefill_softmax() -> PrefillSoftmaxKernel | None:
    """The kernel for this machine, built on first use; None where it cannot be (attention then uses torch)."""
    library = build_library(SOURCE)
    return PrefillSoftmaxKernel(library) if library is not None else None
