"""How the work runs on a CPU or a GPU: native (C) and Triton kernels, each equal to the plain torch path it replaces,
and the decode path that names which of them a step runs (`path`: `DecodePath`, chosen once and passed down).

- `cpu/`: the C kernels, compiled for this machine on first use with the system C compiler (`build`; each C file,
  sharing `team.h`, has its ctypes wrapper in the module of the same name): decoding attention (`paged_decode`),
  a prompt segment's attention (`prefill_attention`), a decoding layer in one call (`decode_layer`), few-row
  linear layers (`rows_linear`), the decoding plan's marks (`plan_marks`); the linear layers' kernels and their
  choice measured per shape on this machine (`linear`, `linear_choice`); the C allocator's settings (`allocator`).
- `triton/`: the Triton kernels (`common`: what they share): decoding attention layer by layer (`decode`), the
  fused decoding body (`attention`, `rows_linear` with its `layer_norm`), the adaptive `embedding` and `softmax`,
  and `sampling`.
- `decode_rows`: what a decoding kernel reads of its rows besides the pool.

Which kernel a part takes is its decode path's (`attention_kernel`, `prefill_kernel` here; the fused layers in
txl.paged; the rest where they are called); where the named kernel does not apply (another device, dtype or
shape), torch's operations compute the part.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .cpu.paged_decode import cpu_paged_decode
from .cpu.prefill_attention import PrefillAttentionKernel, cpu_prefill_attention
from .decode_rows import DecodeRows
from .path import REFERENCE, DecodePath, fastest
from .triton import decode as triton_decode

# q [B, H, Dh], bd [H, B, P], keys, values [H, NB, bs, Dh], the rows' tables and windows -> [B, H, Dh] float32
DecodeKernel = Callable[[Tensor, Tensor, Tensor, Tensor, DecodeRows], Tensor]


def attention_kernel(path: DecodePath, keys: Tensor) -> DecodeKernel | None:
    """The kernel decoding attention takes on `path` for a pool tensor like `keys`, or None for torch's."""
    if path.attention == "triton":
        return triton_decode.triton_paged_decode
    if path.attention == "c" and keys.device.type == "cpu":
        kernel = cpu_paged_decode()
        if kernel is not None and kernel.supports(keys.dtype):
            return kernel
    return None


def prefill_kernel(path: DecodePath, keys: Tensor, query: Tensor) -> PrefillAttentionKernel | None:
    """The native call a prompt segment's attention takes on `path` for a pool tensor like `keys` and queries like
    `query` (float32 on a CPU, outside autograd, which could not see into it), or None for torch's."""
    if path.prefill != "c" or keys.device.type != "cpu" or keys.dtype != torch.float32:
        return None
    if torch.is_grad_enabled() and (query.requires_grad or keys.requires_grad):
        return None
    return cpu_prefill_attention()


__all__ = [
    "REFERENCE",
    "DecodeKernel",
    "DecodePath",
    "DecodeRows",
    "attention_kernel",
    "fastest",
    "prefill_kernel",
]
