"""How the work runs on a CPU or GPU: native (C) and Triton kernels, each with the plain torch path as the reference
it must equal; this module chooses the attention's kernel.

Each C file (`*.c`, sharing `team.h`) has its ctypes wrapper in the module of the same name (`paged_decode`,
`prefill_attention`, `decode_layer`, `rows_linear`, `plan_marks`); `build` compiles, caches and loads them. The
Triton kernels are `triton_decode` and `triton_sampling` (`triton_report` compiles them without a GPU);
`decode_rows` is what a decoding kernel reads of its rows besides the pool. Linear layers take the kernel
measured fastest for their shape (`linear`, `linear_choice`). `allocator` sets the C allocator for CPU inference.
`scoped` is how a block of code picks a kernel.

Decoding (one query per row) reads the rows' blocks in place through a kernel where one applies:

- on a CPU, `paged_decode.c`, compiled for this machine on first use with the system C compiler
  (`-O3 -march=native`) and cached; not used where no compiler is found, the build fails, or
  `TXL_CPU_KERNELS=0` is set;
- on CUDA, a Triton kernel (`triton_decode.py`), unless `TXL_TRITON_KERNELS=0`.

Prompt segments (several queries per row) take, on a CPU in float32, `prefill_attention.c`: a group's whole
attention in one call per layer (its own register-tiled products, the positional shift, mask and softmax in one
pass); elsewhere torch's products.

Elsewhere attention takes the torch path. `reference_path()` forces the torch path for a block of code and
`prefer("triton")` a given kernel (tests compare them; benchmarks measure each).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextvars import ContextVar

import torch
from torch import Tensor

from . import triton_common, triton_decode
from .decode_rows import DecodeRows
from .paged_decode import PagedDecodeKernel, cpu_paged_decode
from .prefill_attention import PrefillAttentionKernel, cpu_prefill_attention
from .scoped import scoped

# q [B, H, Dh], bd [H, B, P], keys, values [H, NB, bs, Dh], the rows' tables and windows -> [B, H, Dh] float32
DecodeKernel = Callable[[Tensor, Tensor, Tensor, Tensor, DecodeRows], Tensor]

_choice: ContextVar[str] = ContextVar("txl_attention_kernel", default="auto")


def prefer(name: str) -> contextlib.AbstractContextManager[None]:
    """Inside this block, decoding attention uses kernel `name`: "torch" (the reference), "cpu", "triton", or
    "auto" (the default: the best one available for the device)."""
    if name not in ("auto", "torch", "cpu", "triton"):
        raise ValueError(f"unknown attention kernel {name!r}")
    return scoped(_choice, name)


def reference_path() -> contextlib.AbstractContextManager[None]:
    """Attention takes the plain torch path inside this block."""
    return prefer("torch")


def triton_chosen(device: torch.device) -> bool:
    """Whether decoding on `device` takes the Triton kernels here: asked for ("triton"), or by default on CUDA
    (on a CPU they run under Triton's interpreter, for tests), and Triton runs there. One choice for everything a
    decoding step runs (attention, the layers' fused operations, sampling): the start-up check compares it as a
    whole with the torch path, and a failure of any part falls back to the torch path for all of them."""
    choice = _choice.get()
    wants = choice == "triton" or (choice == "auto" and device.type == "cuda")
    return wants and triton_common.available(device)


def decode_kernel(keys: Tensor) -> DecodeKernel | None:
    """The kernel decoding attention uses for a pool tensor like `keys`, or None for the torch path."""
    choice = _choice.get()
    if choice == "torch":
        return None
    if triton_chosen(keys.device):
        return triton_decode.triton_paged_decode
    if choice in ("auto", "cpu") and keys.device.type == "cpu":
        kernel = cpu_paged_decode()
        if kernel is not None and kernel.supports(keys.dtype):
            return kernel
    return None


def prefill_kernel(keys: Tensor, query: Tensor) -> PrefillAttentionKernel | None:
    """The native call a prompt segment's attention takes for a pool tensor like `keys` and queries like `query`
    (float32 on a CPU, outside autograd, which could not see into it), or None for the torch path."""
    if _choice.get() not in ("auto", "cpu") or keys.device.type != "cpu" or keys.dtype != torch.float32:
        return None
    if torch.is_grad_enabled() and (query.requires_grad or keys.requires_grad):
        return None
    return cpu_prefill_attention()


def kernel_name(device: torch.device | str, dtype: torch.dtype = torch.float32) -> str:
    """Which kernel decoding uses on `device` by default (for logs and benchmark labels)."""
    kernel = decode_kernel(torch.empty(0, dtype=dtype, device=device))
    if kernel is None:
        return "torch"
    return "triton" if kernel is triton_decode.triton_paged_decode else "cpu"


__all__ = [
    "DecodeKernel",
    "DecodeRows",
    "PagedDecodeKernel",
    "PrefillAttentionKernel",
    "cpu_paged_decode",
    "decode_kernel",
    "kernel_name",
    "prefer",
    "prefill_kernel",
    "reference_path",
    "triton_chosen",
]
