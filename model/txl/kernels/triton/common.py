"""What every Triton kernel here shares: whether Triton runs on a device, the launch (under the tensors' device),
the SM count a grid is sized for, and the semaphores through which a kernel's last program finishes its work.

Several kernels split one row's work over many programs (to fill a GPU's SMs at batch 1) and need one more step
once every part is done: a LayerNorm over a whole row, the combination of attention partitions, the choice of a
sampled token. Rather than a second kernel, each program counts itself in with an atomic add on the row's
semaphore; the program that arrives last finds every other part in memory, finishes the row, and resets the
semaphore to zero for the next launch. Which program arrives last varies, but it reads the parts in a fixed order,
so the results are the same at every run. The semaphores are one zeroed int32 buffer per device, made on first use
(always outside a CUDA graph's capture: a graph's warm-up runs its body eagerly first).

Runs on CUDA; on a CPU only under Triton's interpreter (TRITON_INTERPRET=1), which is how the tests check the
kernels against the torch path where no GPU is present. The interpreter computes a `tl.dot` of half-precision
tiles wrongly (numpy has no bfloat16), so under it the kernels widen the tiles to float32 first: the products a
tensor core forms from the same half-precision numbers, exact in float32.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of torch; the CPU build has it only if installed separately.
    import triton
except ImportError:  # pragma: no cover - depends on the installation
    triton = None

# SMs of the device a grid is sized for where none is present (counting on a CPU): an H100 SXM.
DEFAULT_SMS = 132
# Semaphores per device: enough for the rows x heads of the largest batch an attention launch takes (1,024 rows
# of 16 heads), and more than any other kernel's rows or row blocks.
SEMAPHORES = 1 << 16
# Whether a kernel's a * b + c become fused multiply-adds (one rounding): stated at every launch and ahead-of-time
# compile rather than left to Triton's default, which Triton 3.10 turns off (TRITON_DEFAULT_FP_FUSION), and with it
# the bits every kernel computes. On: what the kernels were checked with, and what CUDA compilers do by default.
FP_FUSION = True


def available(device: torch.device) -> bool:
    """Whether Triton kernels can run on `device` here: Triton is installed, and the device is a GPU or Triton's
    interpreter runs them on the CPU (whether a decode path uses them is the path's: txl.kernels.path)."""
    return triton is not None and (device.type == "cuda" or interpreting())


def interpreting() -> bool:
    """Whether Triton runs its kernels in its interpreter (Triton's own switch, which it reads when imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def device_guard(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The launch runs under the tensors' device: Triton launches on the thread's current device, and a server on
    cuda:1 may call from a thread whose current device is cuda:0."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@functools.cache
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def sms(device: torch.device) -> int:
    """SMs of `device` (DEFAULT_SMS where it is not a GPU)."""
    if device.type != "cuda":
        return DEFAULT_SMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


_semaphores: dict[torch.device, Tensor] = {}


def semaphores(device: torch.device, needed: int) -> Tensor:
    """The device's zeroed int32 semaphores (every kernel leaves them at zero), at least `needed` of them."""
    if needed > SEMAPHORES:
        raise ValueError(f"a launch needs {needed} semaphores, more than the {SEMAPHORES} there are")
    found = _semaphores.get(device)
    if found is None:
        found = _semaphores[device] = torch.zeros(SEMAPHORES, dtype=torch.int32, device=device)
    return found


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **constants: Any) -> None:
    """`kernel[grid](*args, **constants)`, with FP_FUSION stated. On the `meta` device (a step traced for its
    shapes and operations, without data: how kernel launches are counted where no GPU is) the kernel's stand-in is
    one operation that computes nothing, as torch's own operations have meta implementations."""
    first = next(a for a in args if isinstance(a, Tensor))
    if first.is_meta:
        torch.empty((), device="meta").zero_()
        return
    kernel[grid](*args, **constants, enable_fp_fusion=FP_FUSION)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def widen_dots(dtype: torch.dtype) -> bool:
    """Whether a kernel widens half-precision tiles before `tl.dot` (under the interpreter only)."""
    return interpreting() and dtype != torch.float32
