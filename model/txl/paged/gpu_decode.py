"""Decoding steps on a GPU through five launches per layer, where the layer-by-layer path takes about thirty:

    qkv = x @ W_qkv^T                                     torch's product
    a   = attention(qkv)                                  txl.kernels.triton_attention (biases, positions, new
                                                          keys and values, partitions combined)
    h   = LayerNorm(x + a @ W_o^T)                        txl.kernels.triton_rows_linear
    f   = h @ W_1^T                                       torch's product (bias and ReLU applied by the next)
    x'  = LayerNorm(h + relu(f + b_1) @ W_2^T + b_2)      txl.kernels.triton_rows_linear

It takes a step when decoding takes the Triton kernels (`txl.kernels.triton_chosen`: on CUDA by default, anywhere
under `prefer("triton")` where Triton runs), the step feeds one token per row (one query group: a decoding
iteration, eager or a graph's static buffers), the layers are post-norm (the paper's and wt103's), the pool keeps
no layer inputs, and for inference. Everything else takes the layer-by-layer path (`disabled()` forces it). Both read the same weights,
pool and positional tables and write the pool alike; they agree to rounding (the fused kernels sum in another
order and round less often), which the start-up check measures (`txl_server.engine.selfcheck`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from ..kernels import triton_chosen
from ..kernels.decode_rows import GivenRows
from ..kernels.scoped import scoped
from ..kernels.triton_attention import decode_attention, tile_and_warps
from ..kernels.triton_decode import LaunchPlan
from ..kernels.triton_rows_linear import rows_linear
from .pool import BlockPool
from .step import GroupedStep

_enabled: ContextVar[bool] = ContextVar("txl_gpu_decode", default=True)


def disabled() -> contextlib.AbstractContextManager[None]:
    """Inside this block, decoding steps take the layer-by-layer path (with `triton_decode`'s attention where
    Triton is chosen): tests and benchmarks compare the two."""
    return scoped(_enabled, False)


@dataclass(frozen=True)
class _Layer:
    """What the five launches read of a decoder layer (txl.model's, HF's module names)."""

    qkv: Tensor  # [3*H*Dh, D]
    u: Tensor  # [H, Dh] r_w_bias
    v: Tensor  # [H, Dh] r_r_bias
    scale: float
    out: Tensor  # [D, H*Dh]
    norm1: tuple[Tensor, Tensor, float]
    inner: Tensor  # [D_inner, D]
    inner_bias: Tensor  # [D_inner]
    outer: Tensor  # [D, D_inner]
    outer_bias: Tensor  # [D]
    norm2: tuple[Tensor, Tensor, float]

    @classmethod
    def of(cls, layer: nn.Module) -> _Layer:
        attn, ff = cast(Any, layer.dec_attn), cast(Any, layer.pos_ff)  # the paper's modules, by their names
        inner, outer = cast(nn.Linear, ff.CoreNet[0]), cast(nn.Linear, ff.CoreNet[3])
        ln1, ln2 = cast(nn.LayerNorm, attn.layer_norm), cast(nn.LayerNorm, ff.layer_norm)
        return cls(
            attn.qkv_net.weight,
            attn.r_w_bias,
            attn.r_r_bias,
            float(attn.scale),
            attn.o_net.weight,
            (ln1.weight, ln1.bias, ln1.eps),
            inner.weight,
            inner.bias,
            outer.weight,
            outer.bias,
            (ln2.weight, ln2.bias, ln2.eps),
        )


def applies(layers: Sequence[nn.Module], step: GroupedStep, training: bool) -> bool:
    """Whether a decoding step takes the fused kernels (see the module's docstring)."""
    if (
        not _enabled.get()
        or training
        or torch.is_grad_enabled()
        or not triton_chosen(step.pool.layout.device)
    ):
        return False
    if len(step.groups) != 1 or step.groups[0].queries != 1 or step.pool.hidden is not None:
        return False
    return all(not cast(nn.Module, layer.dec_attn).pre_lnorm for layer in layers)


def forward(
    layers: Sequence[nn.Module],
    step: GroupedStep,
    hidden: Tensor,
    tables: Sequence[Tensor],
    *,
    out: Tensor | None = None,
) -> Tensor:
    """hidden [N, D] (the embedded tokens, one per row, in the group's order) -> the last layer's output [N, D]
    (written into `out` if given, by the last kernel: no copy after it); writes each layer's new keys and values
    to the step's slots."""
    pool, group = step.pool, step.groups[0]
    x = hidden
    for i, module in enumerate(layers):
        layer = _Layer.of(module)
        qkv = torch.mm(x, layer.qkv.t())  # [N, 3*H*Dh]
        attended = decode_attention(
            qkv,
            layer.u,
            layer.v,
            tables[i],
            pool.keys[i],
            pool.values[i],
            group,
            step.write_blocks,
            step.write_slots,
            scale=layer.scale,
            n_pos=step.n_pos,
        )  # [N, H*Dh]
        h = rows_linear(attended, layer.out, residual=x, norm=layer.norm1)  # [N, D]
        inner = torch.mm(h, layer.inner.t())  # [N, D_inner], its bias and ReLU applied as the next reads it
        x = rows_linear(
            inner,
            layer.outer,
            layer.outer_bias,
            relu_input=layer.inner_bias,
            residual=h,
            norm=layer.norm2,
            out=out if i == len(layers) - 1 else None,
        )
    return x


# Rows a warm-up step takes, one for each tile of rows `triton_rows_linear` compiles (16, 32, 64).
WARM_UP_ROWS = (1, 17, 33)


@torch.no_grad()
def warm_up(model: Any, pool: BlockPool) -> None:
    """Compiles, at start-up, every variant the fused body launches for `model` over `pool` (a CUDA graph
    captures no compilation, and none should happen while sessions wait): the row linears at every tile of rows,
    the attention split and in one pass (over a scratch pool of three blocks), the embedding and the log-softmax.
    `model`: a `txl.TransfoXLLMHeadModel`."""
    layout = pool.layout
    device, dtype = layout.device, layout.dtype
    layer = _Layer.of(model.transformer.layers[0])
    width, inner = layer.out.size(0), layer.inner.size(0)
    for rows in WARM_UP_ROWS:
        x = torch.zeros((rows, width), dtype=dtype, device=device)
        rows_linear(torch.zeros((rows, layer.out.size(1)), dtype=dtype, device=device), layer.out, residual=x,
                    norm=layer.norm1)  # fmt: skip
        rows_linear(torch.zeros((rows, inner), dtype=dtype, device=device), layer.outer, layer.outer_bias,
                    relu_input=layer.inner_bias, residual=x, norm=layer.norm2)  # fmt: skip
    heads, d_head, block_size = layout.n_head, layout.d_head, pool.block_size
    scratch = torch.zeros((heads, 3, block_size, d_head), dtype=dtype, device=device)

    def index(*values: object) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    # One row of two positions (the end of block 1, the start of block 2): split in two, and in one pass.
    row = GivenRows(index([1, 2]), index(block_size - 1), index(2), index(3))
    qkv = torch.zeros((1, 3 * heads * d_head), dtype=dtype, device=device)
    positions = torch.zeros((heads, 2, d_head), dtype=dtype, device=device)
    tile, _ = tile_and_warps(d_head)
    for plan in (LaunchPlan(tile, tile, 2), LaunchPlan(tile, 2 * tile, 1)):
        decode_attention(qkv, layer.u, layer.v, positions, scratch, scratch.clone(), row, index(2), index(0),
                         scale=layer.scale, n_pos=2, plan=plan)  # fmt: skip
    model.transformer.word_emb(torch.zeros(1, dtype=torch.long, device=device))
    model.log_probs(torch.zeros((1, width), dtype=dtype, device=device))
