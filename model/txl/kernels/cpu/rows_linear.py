"""A linear layer over a few rows on the CPU that reads each weight once, as one stream (`rows_linear.c`).

Why native code: at one row a linear layer is a pass over its weight, and torch's kernels (MKL's gemv, oneDNN's
inner product) read small matrices well below the rate a plain sum over the same bytes reaches; this loop reads
them at close to it (docs/model.md). One of the candidates `txl.kernels.cpu.linear` measures.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from .build import KernelByDtype, load_kernel

SOURCE = Path(__file__).with_name("rows_linear.c")
MAX_ROWS = 16  # beyond, the products bound it and blocked GEMMs win
_ARGS = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4  # W, x, bias, y; R, out, in, threads
# Below this many weight bytes a thread, a team's hand-out and barrier (a few µs) cost more than the split saves.
MIN_BYTES_PER_THREAD = 256 * 1024


class RowsLinearKernel(KernelByDtype):
    ENTRY = "txl_rows_linear_{}_threads"
    ARGS = _ARGS

    def __call__(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """x [..., in] -> [..., out]: F.linear(x, weight, bias) for a contiguous weight [out, in] on the CPU."""
        out_features, in_features = weight.shape
        rows = x.reshape(-1, in_features).float().contiguous()  # [R, in], float32 whatever the weight's type
        y = torch.empty(rows.size(0), out_features, dtype=weight.dtype)  # [R, out]
        threads = self.library.team(weight.numel() * weight.element_size() // MIN_BYTES_PER_THREAD)
        self.functions[weight.dtype](
            weight.data_ptr(),
            rows.data_ptr(),
            bias.data_ptr() if bias is not None else None,
            y.data_ptr(),
            rows.size(0),
            out_features,
            in_features,
            threads,
        )
        return y.view(*x.shape[:-1], out_features)


@functools.cache
def cpu_rows_linear() -> RowsLinearKernel | None:
    """The kernel for this machine, built on first use; None where it cannot be."""
    return load_kernel(SOURCE, RowsLinearKernel, openmp=True)
