"""Native kernels for the paged attention, each with the plain torch path as the reference it must equal.

`cpu_paged_decode()` compiles `paged_decode.c` for this machine's CPU on first use (with the system C compiler,
`-O3 -march=native`) and caches the shared library; it returns None where no compiler is found, the build
fails, or `TXL_CPU_KERNELS=0` is set, and attention then takes the torch path (see docs/model.md).
`reference_path()` forces the torch path for a block of code (tests compare the two; benchmarks measure both).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from .cpu import PagedDecodeKernel, cpu_paged_decode

_use_kernels: ContextVar[bool] = ContextVar("txl_use_kernels", default=True)


def kernels_enabled() -> bool:
    return _use_kernels.get()


@contextlib.contextmanager
def reference_path() -> Iterator[None]:
    """Attention takes the plain torch path inside this block."""
    token = _use_kernels.set(False)
    try:
        yield
    finally:
        _use_kernels.reset(token)


__all__ = ["PagedDecodeKernel", "cpu_paged_decode", "kernels_enabled", "reference_path"]
