"""The decode path: which code runs each part of a step, one value chosen once and passed down.

A step (one forward over a batch of rows, the next tokens' distribution, their sampling) runs each of its parts
through torch's operations or through a kernel written for it. A `DecodePath` names, for each part:

- `attention`: decoding attention, one query per row over the rows' blocks in the pool: "c" (cpu/paged_decode.c,
  on a CPU, float32 or bfloat16), "triton" (triton/decode.py) or "torch";
- `prefill`: a prompt segment's attention, several queries per row: "c" (cpu/prefill_attention.c, on a CPU in
  float32) or "torch";
- `layers`: a decoding step's layers, each fused whole: "c" (one native call per layer, cpu/decode_layer.c: a few
  rows in float32 on a CPU; txl.paged.fused_decode), "triton" (five launches per layer, txl.paged.gpu_decode) or
  "torch" (layer by layer, each part as named here);
- `linear`: the kernels a linear layer on a CPU may take (cpu/linear.py): one, or several, of which each layer
  shape takes the one measured fastest on this machine;
- `embedding`, `softmax`, `sampler`: the adaptive embedding, the adaptive log-softmax and the sampler, as Triton
  kernels ("triton") or torch's operations;
- `graphs`: how a server launches a decoding iteration: "cuda" (captured CUDA graphs), "static" (their static
  buffers run eagerly: the CPU's form, for tests) or "off" (txl_server.engine.graphs reads it; the model does not).

A kernel named runs its part wherever it applies (its device, dtype and shape, each kernel's module says);
elsewhere the part takes torch's operations, which compute the same function. `DecodePath()` (`REFERENCE`: torch
everywhere) is the reference every kernel is tested against, and `torch_variant()` is a path's own. Nothing below
the caller reads any other switch, no context and no environment: a server chooses its path at start-up and checks
it against its torch variant before it serves (txl_server.engine.selfcheck); `fastest(device)` is the path this
machine can run, unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import torch

from .cpu.decode_layer import cpu_decode_layer
from .cpu.linear_choice import KERNELS, TORCH, C
from .cpu.paged_decode import cpu_paged_decode
from .cpu.prefill_attention import cpu_prefill_attention
from .triton.common import available as triton_available

Kernel = Literal["torch", "c", "triton"]
Graphs = Literal["off", "static", "cuda"]

# What each part may name.
CHOICES: dict[str, tuple[str, ...]] = {
    "attention": ("torch", "c", "triton"),
    "prefill": ("torch", "c"),
    "layers": ("torch", "c", "triton"),
    "embedding": ("torch", "triton"),
    "softmax": ("torch", "triton"),
    "sampler": ("torch", "triton"),
    "graphs": ("off", "static", "cuda"),
}


@dataclass(frozen=True)
class DecodePath:
    """Which code runs each part of a step (see the module's docstring). Frozen: chosen once, passed down."""

    attention: Kernel = "torch"
    prefill: Kernel = "torch"
    layers: Kernel = "torch"
    linear: tuple[str, ...] = (TORCH,)  # in KERNELS' order ("torch", "onednn", "c")
    embedding: Kernel = "torch"
    softmax: Kernel = "torch"
    sampler: Kernel = "torch"
    graphs: Graphs = "off"

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {', '.join(allowed)}")
        linear = tuple(self.linear)
        if not linear or any(k not in KERNELS for k in linear):
            raise ValueError(f"linear {linear!r}: one or more of {', '.join(KERNELS)}")
        # One order for one set: equal paths compare (and key the linear layers' choices) alike.
        object.__setattr__(self, "linear", tuple(k for k in KERNELS if k in linear))

    @classmethod
    def c(cls, linear: tuple[str, ...] = KERNELS, graphs: Graphs = "off") -> DecodePath:
        """The C kernels (a CPU): attention, prompt segments, and the fused layer where the linear layers may
        take the C loop (the fused layer's products are that loop's)."""
        return cls(
            attention="c", prefill="c", layers="c" if C in linear else "torch", linear=linear, graphs=graphs
        )

    @classmethod
    def triton(cls, linear: tuple[str, ...] = (TORCH,), graphs: Graphs = "off") -> DecodePath:
        """Everything a decoding step runs as Triton kernels (a GPU; a CPU under Triton's interpreter): attention,
        the fused layers, the embedding, the log-softmax and sampling."""
        return cls(
            attention="triton",
            layers="triton",
            linear=linear,
            embedding="triton",
            softmax="triton",
            sampler="triton",
            graphs=graphs,
        )

    def torch_variant(self) -> DecodePath:
        """This path with torch's operations for every part it gives a kernel: the reference it is checked
        against. Its linear kernels and graphs are kept (each linear kernel equals torch's to rounding and is
        chosen by speed alone; graphs are checked against this path run eagerly)."""
        return DecodePath(linear=self.linear, graphs=self.graphs)

    def describe(self) -> str:
        """One line: every part and what runs it."""
        parts = []
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "linear":
                value = value[0] if len(value) == 1 else f"fastest of {'/'.join(value)}"
            parts.append(f"{field.name} {value}")
        return ", ".join(parts)


REFERENCE = DecodePath()


def fastest(device: torch.device | str, *, linear: tuple[str, ...] = KERNELS) -> DecodePath:
    """The fastest path this machine can run on `device`, unchecked: Triton's kernels on a GPU where Triton is
    installed, the C kernels on a CPU where they build (each linear layer taking the fastest of `linear`), else
    torch's (a server checks what it chooses against the torch variant: txl_server.engine.selfcheck)."""
    device = torch.device(device)
    if device.type == "cuda":
        return DecodePath.triton() if triton_available(device) else REFERENCE
    built = cpu_paged_decode() is not None and cpu_prefill_attention() is not None
    if built and cpu_decode_layer() is not None:
        return DecodePath.c(linear)
    return DecodePath(linear=linear)
