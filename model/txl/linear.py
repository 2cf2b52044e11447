"""Linear layers for CPU inference through oneDNN, with weights packed once.

On this CPU (AMD EPYC, 2 cores) torch's default CPU linear (MKL) reads weights at about 14 GB/s for one row and
7 GB/s for 4-16 rows, while oneDNN's inner product, given a weight in its own layout, reaches 25 and 17 GB/s,
and is 1.6x faster for 128-row segments too (see docs/benchmarks.md, speed work). Decoding is bound by reading
weights, so this is most of a step's time.

The packed copy is made on first use, outside autograd only (training keeps the plain path), and remade when
the weight changes (its storage or version). It costs a second copy of the packed weights in memory.

oneDNN runs bfloat16 only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; elsewhere (AVX2-only x86-64, e.g.
many AMD EPYC and desktop parts) `mkldnn_linear` raises, so bfloat16 takes torch's plain kernel there: correct,
but slow (see `cpu_runs_bfloat16`).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

_PACKABLE = (torch.float32, torch.bfloat16)


@functools.cache
def cpu_runs_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively, so that oneDNN's bfloat16 kernels can run.

    Asks oneDNN itself: the check `mkldnn_linear` makes before it raises, which also honours oneDNN's
    `ONEDNN_MAX_CPU_ISA=AVX2` (how an AVX2-only CPU is simulated on a newer one). Without it, a plain bfloat16
    matmul is a scalar loop: 0.34 GFLOP/s against 136 for float32 on an AVX2 EPYC. Tests replace this function
    to take the other branch.
    """
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the probe: the flags oneDNN asks for
        caps = torch.cpu.get_capabilities()
        return bool(
            caps.get("avx_ne_convert") or all(caps.get(f) for f in ("avx512_bw", "avx512_vl", "avx512_dq"))
        )


def use_packed(x: Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype in _PACKABLE
        and not torch.is_grad_enabled()
        and torch.backends.mkldnn.is_available()
        and (x.dtype != torch.bfloat16 or cpu_runs_bfloat16())
    )


class _Packed:
    __slots__ = ("bias", "key", "weight")

    def __init__(self, key: tuple, weight: Tensor, bias: Tensor | None) -> None:
        self.key = key
        self.weight = weight.contiguous().to_mkldnn()
        self.bias = bias.contiguous().to_mkldnn() if bias is not None else None


def _key(weight: Tensor, bias: Tensor | None) -> tuple:
    parts = [weight.data_ptr(), weight._version, tuple(weight.shape), weight.dtype]
    if bias is not None:
        parts += [bias.data_ptr(), bias._version]
    return tuple(parts)


def packed_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, owner: nn.Module, slot: str = "_packed"
) -> Tensor:
    """F.linear(x, weight, bias), through oneDNN with a weight packed once and kept on `owner` (CPU inference)."""
    if not use_packed(x) or x.dtype != weight.dtype:
        return nn.functional.linear(x, weight, bias)
    key = _key(weight, bias)
    packed: _Packed | None = getattr(owner, slot, None)
    if packed is None or packed.key != key:
        packed = _Packed(key, weight, bias)
        object.__setattr__(owner, slot, packed)  # a cache, not a parameter or buffer of the module
    rows = x.reshape(-1, x.size(-1))
    out = torch._C._nn.mkldnn_linear(rows.contiguous().to_mkldnn(), packed.weight, packed.bias)
    return out.to_dense().view(*x.shape[:-1], weight.size(0))


def linear(x: Tensor, layer: nn.Linear) -> Tensor:
    """`layer(x)` for an nn.Linear, packed for CPU inference."""
    return packed_linear(x, layer.weight, layer.bias, layer)
