"""Decoding steps on a GPU through five launches per layer, where the layer-by-layer path takes about thirty:

    qkv = x @ W_qkv^T                                     torch's product
    a   = attention(qkv)                                  txl.kernels.triton.attention (biases, positions, new
                                                          keys and values, partitions combined)
    h   = LayerNorm(x + a @ W_o^T)                        txl.kernels.triton.rows_linear
    f   = h @ W_1^T                                       torch's product (bias and ReLU applied by the next)
    x'  = LayerNorm(h + relu(f + b_1) @ W_2^T + b_2)      txl.kernels.triton.rows_linear (its LayerNorm above a
                                                          few rows: txl.kernels.triton.layer_norm)

It takes a step when its decode path names it (`DecodePath.layers == "triton"`, txl.kernels.path: on a GPU, or
a CPU under Triton's interpreter), the step feeds one token per row (one query group: a decoding iteration, eager
or a graph's static buffers), the layers are post-norm (the paper's and wt103's), the pool keeps no layer inputs,
and for inference. Everything else takes the layer-by-layer path. Both read the same weights (by name:
`decode_weights`, txl.paged.layer_weights), pool and positional tables and write the pool alike; they agree to
rounding (the fused kernels sum in another order and round less often), which the start-up check measures
(`txl_server.engine.selfcheck`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..kernels import DecodePath
from ..kernels.decode_rows import GivenRows
from ..kernels.triton.attention import decode_attention, tile_and_warps
from ..kernels.triton.decode import LaunchPlan
from ..kernels.triton.rows_linear import rows_linear
from .layer_weights import DecoderLayer
from .pool import BlockPool
from .step import GroupedStep


def applies(path: DecodePath, layers: Sequence[DecoderLayer], step: GroupedStep, training: bool) -> bool:
    """Whether a decoding step takes the fused kernels on `path` (see the module's docstring)."""
    if path.layers != "triton" or training or torch.is_grad_enabled():
        return False
    if len(step.groups) != 1 or step.groups[0].queries != 1 or step.pool.hidden is not None:
        return False
    return all(not layer.decode_weights().pre_lnorm for layer in layers)


def forward(
    layers: Sequence[DecoderLayer],
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
        layer = module.decode_weights()
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
        h = rows_linear(
            attended, layer.out, residual=x, norm=(layer.norm1, layer.norm1_bias, layer.eps1)
        )  # [N, D]
        inner = torch.mm(h, layer.inner.t())  # [N, D_inner], its bias and ReLU applied as the next reads it
        x = rows_linear(
            inner,
            layer.outer,
            layer.outer_bias,
            relu_input=layer.inner_bias,
            residual=h,
            norm=(layer.norm2, layer.norm2_bias, layer.eps2),
            out=out if i == len(layers) - 1 else None,
        )
    return x


# Rows a warm-up step takes, one for each tile of rows `triton_rows_linear` compiles (16, 32, 64).
WARM_UP_ROWS = (1, 17, 33)


@torch.no_grad()
def warm_up(model: Any, pool: BlockPool, path: DecodePath) -> None:
    """Compiles, at start-up, every variant the fused body launches for `model` over `pool` on `path` (a CUDA
    graph captures no compilation, and none should happen while sessions wait): the row linears at every tile of
    rows, the attention split and in one pass (over a scratch pool of three blocks), the embedding and the
    log-softmax. `model`: a `txl.TransfoXLLMHeadModel`."""
    layout = pool.layout
    device, dtype = layout.device, layout.dtype
    layer = model.transformer.layers[0].decode_weights()
    width, inner = layer.out.size(0), layer.inner.size(0)
    norm1, norm2 = (layer.norm1, layer.norm1_bias, layer.eps1), (layer.norm2, layer.norm2_bias, layer.eps2)
    for rows in WARM_UP_ROWS:
        x = torch.zeros((rows, width), dtype=dtype, device=device)
        rows_linear(torch.zeros((rows, layer.out.size(1)), dtype=dtype, device=device), layer.out, residual=x,
                    norm=norm1)  # fmt: skip
        rows_linear(torch.zeros((rows, inner), dtype=dtype, device=device), layer.outer, layer.outer_bias,
                    relu_input=layer.inner_bias, residual=x, norm=norm2)  # fmt: skip
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
    model.transformer.word_emb(torch.zeros(1, dtype=torch.long, device=device), path)
    model.log_probs(torch.zeros((1, width), dtype=dtype, device=device), path)
