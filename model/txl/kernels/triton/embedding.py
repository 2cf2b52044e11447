"""The adaptive input embedding of a decoding step's tokens in one Triton kernel (Baevski & Auli, 2019).

Token t of cluster c (the cluster whose id range holds it) is embedded as emb_scale * P_c E_c[t - lo_c]. Without a
host decision on which token falls where, the torch path embeds every token in every cluster and masks
(`txl.adaptive.AdaptiveEmbedding._masked`: a dozen launches a cluster). Here each program takes one token and a
slice of the output features, finds its cluster, and reads only that cluster's row and projection slice: one
launch. Rounded as the torch path rounds: the projection to the model's dtype, then the scaled product.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from . import common
from .common import device_guard, next_power_of_2, triton

if triton is not None:
    import triton.language as tl

MAX_CLUSTERS = 4  # wt103's; a vocabulary cut into more takes the torch path
BLOCK_N = 32  # output features a program writes
BLOCK_E = 128  # embedding features a program reads per iteration
NUM_WARPS = 4


@functools.cache
def jit_kernel() -> Any:
    @triton.jit(do_not_specialize=["lo1", "lo2", "lo3", "vocab"])
    def adaptive_embedding(
        tokens,  # [N] int64
        e0,  # [n_i, d_i] each cluster's embedding (model dtype)
        e1,
        e2,
        e3,
        p0,  # [D, d_i] each cluster's projection
        p1,
        p2,
        p3,
        out,  # [N, D] model dtype
        lo1,  # first id of cluster 1, 2, 3
        lo2,
        lo3,
        vocab,
        scale,
        D: tl.constexpr,
        D0: tl.constexpr,  # each cluster's width
        D1: tl.constexpr,
        D2: tl.constexpr,
        D3: tl.constexpr,
        CLUSTERS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_E: tl.constexpr,
    ):
        n = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < D
        dtype = out.dtype.element_ty
        token = tl.load(tokens + n)
        acc = tl.zeros((BLOCK_N,), tl.float32)
        features = tl.arange(0, BLOCK_E)
        # Cluster by cluster, as a static sequence: only the token's own cluster reads anything.
        for c in tl.static_range(CLUSTERS):
            if c == 0:
                lo, hi, width, emb, proj = 0, lo1, D0, e0, p0
            elif c == 1:
                lo, hi, width, emb, proj = lo1, lo2, D1, e1, p1
            elif c == 2:
                lo, hi, width, emb, proj = lo2, lo3, D2, e2, p2
            else:
                lo, hi, width, emb, proj = lo3, vocab, D3, e3, p3
            if (token >= lo) & (token < hi):
                row = emb + (token - lo) * width
                for f0 in range(0, width, BLOCK_E):
                    f = f0 + features
                    f_ok = f < width
                    e = tl.load(row + f, mask=f_ok, other=0.0).to(tl.float32)
                    p = tl.load(
                        proj + cols[:, None] * width + f[None, :],
                        mask=col_ok[:, None] & f_ok[None, :],
                        other=0.0,
                    )
                    acc += tl.sum(p.to(tl.float32) * e[None, :], axis=1)
        embedded = (acc.to(dtype).to(tl.float32) * scale).to(dtype)
        tl.store(out + n * D + cols, embedded, mask=col_ok)

    return adaptive_embedding


def adaptive_embedding(
    tokens: Tensor,
    embeddings: Sequence[Tensor],
    projections: Sequence[Tensor],
    cutoff_ends: Sequence[int],
    scale: float,
) -> Tensor | None:
    """tokens [N] -> [N, D] (the model's dtype): token t of cluster c embedded as scale * P_c E_c[t - lo_c].
    `embeddings` [n_c, d_c] and `projections` [D, d_c] per cluster, `cutoff_ends` [0, c1, ..., vocab]. None where
    the vocabulary has more than MAX_CLUSTERS clusters (the caller takes the torch path)."""
    clusters = len(embeddings)
    if clusters > MAX_CLUSTERS:
        return None
    width = projections[0].size(0)
    n = tokens.size(0)
    device = tokens.device
    padded_e = [*embeddings, *[embeddings[0]] * (MAX_CLUSTERS - clusters)]
    padded_p = [*projections, *[projections[0]] * (MAX_CLUSTERS - clusters)]
    dims = [e.size(1) for e in padded_e]
    lows = [*cutoff_ends[1:clusters], *[cutoff_ends[-1]] * (MAX_CLUSTERS - clusters)]
    with device_guard(device):
        out = torch.empty((n, width), dtype=embeddings[0].dtype, device=device)
        common.launch(
            jit_kernel(),
            (n, -(-width // BLOCK_N)),
            tokens,
            *padded_e,
            *padded_p,
            out,
            *lows[:3],
            cutoff_ends[-1],
            scale,
            D=width,
            D0=dims[0],
            D1=dims[1],
            D2=dims[2],
            D3=dims[3],
            CLUSTERS=clusters,
            BLOCK_N=BLOCK_N,
            BLOCK_E=min(BLOCK_E, next_power_of_2(max(dims))),
            num_warps=NUM_WARPS,
        )
    return out
