"""A linear layer over a few rows on the CPU that reads each weight once, as one stream (`rows_linear.c`).

Why native code: at one row a linear layer is a pass over its weight, and torch's kernels (MKL's gemv, oneDNN's
inner product) read the bundled model's small matrices at 9-12 GB/s on an AMD EPYC, one thread, where a sum over
the same bytes reads 30 GB/s; this loop reads them at 20-26 GB/s. One of the candidates `txl.linear` measures.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from .cpu import build_library

SOURCE = Path(__file__).with_name("rows_linear.c")
MAX_ROWS = 16  # beyond, the products bound it and blocked GEMMs win
_ARGS = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 5


class RowsLinearKernel:
    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions = {
            torch.float32: library.txl_rows_linear_f32,
            torch.bfloat16: library.txl_rows_linear_bf16,
        }
        for function in self._functions.values():
            function.argtypes = _ARGS
            function.restype = None

    def supports(self, dtype: torch.dtype) -> bool:
        return dtype in self._functions

    def __call__(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """x [..., in] -> [..., out]: F.linear(x, weight, bias) for a contiguous weight [out, in] on the CPU."""
        out_features, in_features = weight.shape
        rows = x.reshape(-1, in_features).float().contiguous()  # [R, in], float32 whatever the weight's type
        y = torch.empty(rows.size(0), out_features, dtype=weight.dtype)  # [R, out]
        self._functions[weight.dtype](
            weight.data_ptr(),
            rows.data_ptr(),
            bias.data_ptr() if bias is not None else None,
            y.data_ptr(),
            rows.size(0),
            out_features,
            in_features,
            0,
            out_features,
        )
        return y.view(*x.shape[:-1], out_features)


@functools.cache
def cpu_rows_linear() -> RowsLinearKernel | None:
    """The kernel for this machine, built on first use; None where it cannot be."""
    library = build_library(SOURCE)
    return RowsLinearKernel(library) if library is not None else None
