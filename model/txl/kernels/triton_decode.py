"""The GPU decode kernel (Triton): relative attention of one query per row over paged keys and values.

The same contract as the CPU kernel (paged_decode.c): program (b, h) walks row b's block table, scores each
key as q . K[j] + bd[h, b, P - 1 - (p - j)] (the positional term, computed beforehand for every distance),
and keeps a running softmax (max, normaliser, weighted sum of values) across blocks, so the memory is read once
and no score matrix is written. Keys outside [max(start, p - window + 1), p] are masked. It reads the block
table from device memory: nothing depends on the host, so a CUDA graph can capture it.

Runs on CUDA; on a CPU only under Triton's interpreter (TRITON_INTERPRET=1), which is how the tests check it
against the torch path where no GPU is present.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from .rows import DecodeRows

try:  # Triton ships with CUDA builds of torch; the CPU build has it only if installed separately.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None


def available(device: torch.device) -> bool:
    """Whether the kernel can run on `device` here."""
    if triton is None or os.environ.get("TXL_TRITON_KERNELS", "1") == "0":
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _kernel():
    @triton.jit
    def paged_decode(
        q,  # [B, H, Dh]
        bd,  # [H, B, P] float32
        keys,  # [H, NB, bs, Dh]
        values,
        table,  # [B, S] int64
        starts,  # [B] int64
        klens,
        windows,
        out,  # [B, H, Dh] float32
        B,
        H,
        S,
        NB,
        P,
        D: tl.constexpr,
        BS: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        b = tl.program_id(0)
        h = tl.program_id(1)
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < D
        query = tl.load(q + (b * H + h) * D + dims, mask=dim_ok, other=0.0).to(tl.float32)
        start = tl.load(starts + b)
        p = start + tl.load(klens + b) - 1  # the query's position in its table
        first = tl.maximum(start, p - tl.load(windows + b) + 1)
        slots = tl.arange(0, BS)
        running_max = tl.full((), float("-inf"), tl.float32)
        normaliser = tl.zeros((), tl.float32)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        head = h.to(tl.int64) * NB * BS * D
        for i in range(first // BS, p // BS + 1):
            block = tl.load(table + b * S + i)
            j = i * BS + slots  # [BS] key positions
            valid = (j >= first) & (j <= p)
            offsets = head + (block * BS + slots)[:, None] * D + dims[None, :]  # [BS, BLOCK_D]
            tile_mask = valid[:, None] & dim_ok[None, :]
            k = tl.load(keys + offsets, mask=tile_mask, other=0.0).to(tl.float32)
            positional = tl.load(bd + (h * B + b) * P + (P - 1 - (p - j)), mask=valid, other=0.0)
            score = tl.sum(k * query[None, :], axis=1) + positional
            score = tl.where(valid, score, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(score, axis=0))
            scale = tl.exp(running_max - new_max)
            weight = tl.exp(score - new_max)
            v = tl.load(values + offsets, mask=tile_mask, other=0.0).to(tl.float32)
            normaliser = normaliser * scale + tl.sum(weight, axis=0)
            acc = acc * scale + tl.sum(weight[:, None] * v, axis=0)
            running_max = new_max
        tl.store(out + (b * H + h) * D + dims, acc / normaliser, mask=dim_ok)

    return paged_decode


def triton_paged_decode(q: Tensor, bd: Tensor, keys: Tensor, values: Tensor, rows: DecodeRows) -> Tensor:
    """q [B, H, Dh], bd [H, B, P] float32, keys/values [H, NB, bs, Dh] -> [B, H, Dh] float32."""
    table, starts, key_lengths, windows = rows.table, rows.starts, rows.key_lengths, rows.windows
    batch, heads, d_head = q.shape
    _, n_blocks, block_size, _ = keys.shape
    out = torch.empty((batch, heads, d_head), dtype=torch.float32, device=q.device)
    _kernel()[(batch, heads)](
        q.contiguous(),
        bd.contiguous(),
        keys,
        values,
        table.contiguous(),
        starts,
        key_lengths,
        windows,
        out,
        batch,
        heads,
        table.size(1),
        n_blocks,
        bd.size(2),
        D=d_head,
        BS=block_size,
        BLOCK_D=triton.next_power_of_2(d_head),
    )
    return out
