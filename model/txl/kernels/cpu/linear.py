"""Linear layers for CPU inference, each computed by the kernel that measured fastest for its shape on this CPU.

Three kernels compute `F.linear` on a CPU, and none wins everywhere:

- torch: torch's own (MKL's gemm in float32, oneDNN's matmul in bfloat16), reading the weight as stored;
- onednn: oneDNN's inner product over a copy of the weight packed once into oneDNN's blocked layout
  (`torch.ops.mkldnn._linear_pointwise`, the kernel inductor's CPU freezing uses), dense input and output;
- c: a loop compiled for this machine that reads the weight once, as one stream (`rows_linear.c`), for up to 16
  rows (decoding's case).

At one row a layer is a pass over its weight, which the C loop reads fastest; a call into oneDNN costs a
fixed overhead whatever its size, so at one row torch's beats packed on small matrices; from a few rows on the
products, not the reads, bound the work, and oneDNN's blocked products win where MKL's gemm runs at a fraction of
the CPU's rate. Packing every layer regardless (an earlier version, over `to_mkldnn` copies that also converted
every input and output) made decoding slower than torch's. So where a decode path allows several kernels
(`DecodePath.linear`, txl.kernels.path) the kernel is chosen per layer shape, dtype, rows bucket and thread count
by timing them on this machine the first time that entry is needed, and the choice is cached on disk
(`txl.kernels.cpu.linear_choice`); where it allows one, that one runs wherever it can (torch's elsewhere). The
measurements: docs/model.md, speed on CPU.

A layer keeps a second copy of its weight only for a kernel it chose (oneDNN's layout, or a contiguous copy of a
transposed weight for the C kernel). Training (autograd) and GPUs take torch's.

oneDNN runs bfloat16 only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; elsewhere (AVX2-only x86-64, e.g.
many AMD EPYC and desktop parts) it raises, so bfloat16 takes the other kernels there: correct, but torch's is
slow (see `cpu_runs_bfloat16`).
"""

from __future__ import annotations

import functools
from functools import partial

import torch
from torch import Tensor, nn

from .build import cache_dir
from .linear_choice import (
    KERNELS,
    ONEDNN,
    TORCH,
    C,
    Entry,
    KernelChoices,
    last_level_cache_bytes,
    rows_bucket,
    this_machine,
)
from .rows_linear import MAX_ROWS, cpu_rows_linear


@functools.cache
def cpu_runs_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively, so that oneDNN's bfloat16 kernels can run.

    Asks oneDNN itself: the check its linear kernels make before they raise, which also honours oneDNN's
    `ONEDNN_MAX_CPU_ISA=AVX2` (how an AVX2-only CPU is simulated on a newer one). Without it, a plain bfloat16
    matmul is a scalar loop, hundreds of times slower than float32 (docs/model.md). Tests replace this function
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


@functools.cache
def onednn_available() -> bool:
    """Whether this torch has oneDNN's packed linear kernel (a build with oneDNN: every x86-64 wheel)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2), None)
        torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2), weight, None, "none", [], "")
    except (AttributeError, RuntimeError):
        return False
    return True


def candidates(dtype: torch.dtype, rows: int, allowed: tuple[str, ...] = KERNELS) -> tuple[str, ...]:
    """The kernels of `allowed` that can compute a linear layer of `dtype` over `rows` rows on this CPU, torch's
    first (always: it runs everywhere)."""
    names = [TORCH]
    if (
        ONEDNN in allowed
        and onednn_available()
        and (dtype == torch.float32 or (dtype == torch.bfloat16 and cpu_runs_bfloat16()))
    ):
        names.append(ONEDNN)
    if (
        C in allowed
        and rows <= MAX_ROWS
        and (kernel := cpu_rows_linear()) is not None
        and kernel.supports(dtype)
    ):
        names.append(C)
    return tuple(names)


@functools.cache
def kernel_choices() -> KernelChoices:
    """This process's measured choices, read from and saved to this machine's cache file."""
    return KernelChoices(this_machine(cpu_runs_bfloat16()), cache_dir())


def _onednn(x: Tensor, packed: Tensor, bias: Tensor | None, activation: str = "none") -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, activation, [], "")


def _c(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    kernel = cpu_rows_linear()
    assert kernel is not None  # a candidate only where it was built
    return kernel(x, weight, bias)


class _LayerKernels:
    """One layer's weight as each kernel reads it, and its measured kernel per (rows bucket, threads, kernels
    allowed)."""

    __slots__ = ("bias", "chosen", "dense", "key", "packed", "weight")

    def __init__(self, key: tuple, weight: Tensor, bias: Tensor | None) -> None:
        self.key = key
        self.weight, self.bias = weight, bias
        self.packed: Tensor | None = None  # oneDNN's layout
        self.dense: Tensor | None = None  # contiguous, for the C kernel (a copy of a transposed weight)
        self.chosen: dict[tuple[int, int, tuple[str, ...]], str] = {}

    def run(self, kernel: str, x: Tensor, relu: bool = False) -> Tensor:
        """The layer's output through `kernel`, with a ReLU after it if `relu` (oneDNN applies it as it writes
        the output, the others in place after)."""
        if kernel == ONEDNN:
            if self.packed is None:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.contiguous(), None)
            return _onednn(x, self.packed, self.bias, "relu" if relu else "none")
        if kernel == TORCH:
            out = nn.functional.linear(x, self.weight, self.bias)
        else:
            if self.dense is None:
                self.dense = self.weight.contiguous()
            out = _c(x, self.dense, self.bias)
        return out.relu_() if relu else out

    def choose(self, rows: int, threads: int, allowed: tuple[str, ...]) -> str:
        """The measured (or cached) kernel of `allowed` for `rows` input rows."""
        weight = self.weight
        out_features, in_features = weight.shape
        names = candidates(weight.dtype, rows, allowed)
        # [rows, in]; its own generator: measuring must not move the global random state
        sample = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        copies = self._copies(rows) if len(names) > 1 else []
        runs = {name: partial(_run_all, copies, name, sample) for name in names}
        entry = Entry(out_features, in_features, weight.dtype, rows, threads)
        kernel = kernel_choices().choose(entry, runs)
        self.chosen[(rows, threads, allowed)] = kernel
        kept = set(self.chosen.values())
        if ONEDNN not in kept:
            self.packed = None  # not used: not worth its memory
        if C not in kept:
            self.dense = None
        return kernel

    def _copies(self, rows: int) -> list[_LayerKernels]:
        """Copies of this layer to time the kernels over, as a decode step's weights are read: each once, from
        memory. One call on one weight measures something else: warm in L2, torch's kernels matched the C
        one on the bundled model's matrices, and with the caches flushed before each call every kernel paid
        cold-start latencies, while over a pass through enough copies to outgrow the last-level cache the
        kernels ranked as they do in the model (docs/model.md). Enough copies for
        twice the last-level cache (at most 64, 128 MiB), fewer where the products dominate (at most about
        50 MFLOP a pass)."""
        weight, bias = self.weight, self.bias
        size = weight.numel() * weight.element_size()
        flops = 2 * rows * weight.numel()
        count = min(64, (128 << 20) // size, 2 * last_level_cache_bytes() // size, 50_000_000 // flops)
        return [self] + [
            _LayerKernels((), weight.clone(), bias.clone() if bias is not None else None)
            for _ in range(max(0, count - 1))
        ]


def _run_all(layers: list[_LayerKernels], kernel: str, x: Tensor) -> None:
    for layer in layers:
        layer.run(kernel, x)


def _key(weight: Tensor, bias: Tensor | None) -> tuple:
    """What a layer's copies of its weight are valid for (every call computes it: no intermediate list)."""
    if bias is None:
        return (weight.data_ptr(), weight._version, weight.shape, weight.dtype)
    return (weight.data_ptr(), weight._version, weight.shape, weight.dtype, bias.data_ptr(), bias._version)


def packed_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    owner: nn.Module,
    slot: str = "_kernels",
    *,
    kernels: tuple[str, ...],
    relu: bool = False,
) -> Tensor:
    """F.linear(x, weight, bias) (then a ReLU if `relu`) through a kernel of `kernels` (a decode path's `linear`):
    the one given wherever it can run, or the one measured fastest for this shape on this CPU (inference); the
    weight's copies for other kernels (if any) kept on `owner` under `slot`."""
    if kernels == (TORCH,) or x.device.type != "cpu" or x.dtype != weight.dtype or torch.is_grad_enabled():
        out = nn.functional.linear(x, weight, bias)
        return torch.relu(out) if relu else out
    key = _key(weight, bias)
    layer: _LayerKernels | None = owner.__dict__.get(slot)
    if layer is None or layer.key != key:
        layer = _LayerKernels(key, weight, bias)
        object.__setattr__(owner, slot, layer)  # a cache, not a parameter or buffer of the module
    rows = rows_bucket(x.numel() // max(1, x.size(-1)))
    if len(kernels) == 1:
        kernel = kernels[0] if kernels[0] in candidates(weight.dtype, rows, kernels) else TORCH
    else:
        threads = torch.get_num_threads()
        kernel = layer.chosen.get((rows, threads, kernels)) or layer.choose(rows, threads, kernels)
    return layer.run(kernel, x, relu)


def chosen_kernels(model: nn.Module) -> dict[str, str]:
    """What the linear layers of `model` have chosen so far: an entry's key (shape, dtype, rows bucket,
    threads) -> kernel name (for logs and benchmark reports)."""
    out = {}
    for module in model.modules():
        for layer in vars(module).values():
            if isinstance(layer, _LayerKernels):
                out_features, in_features = layer.weight.shape
                for (rows, threads, _), kernel in layer.chosen.items():
                    out[Entry(out_features, in_features, layer.weight.dtype, rows, threads).key] = kernel
    return out


def linear(x: Tensor, layer: nn.Linear, kernels: tuple[str, ...], *, relu: bool = False) -> Tensor:
    """`layer(x)` for an nn.Linear (then a ReLU if `relu`: fused into oneDNN's product, where one is chosen),
    through a kernel of `kernels` (`packed_linear`)."""
    return packed_linear(x, layer.weight, layer.bias, layer, kernels=kernels, relu=relu)
