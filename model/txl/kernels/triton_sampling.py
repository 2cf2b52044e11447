"""The GPU side of top-p's threshold search (Triton): for each row, the probability mass above each of several
pivots, in one pass over the row's logits.

`txl.nucleus.threshold_search` narrows, per row, an interval of 32-bit keys (the logits' float bits, in order)
that holds the smallest logit whose better tokens hold less than top_p of the mass. With one pivot a pass, that
is 32 passes over [rows, vocabulary]: in torch, three kernels each (compare, select, sum), about 18 bytes a word
moved, 32 times. This kernel tests PIVOTS pivots a pass, reading each logit once (4 bytes) and computing its key
and probability in registers, so the interval shrinks 17-fold a pass: 8 passes. A sort of the vocabulary, which
it replaces, moves about 100 bytes a word (4 radix passes over values and int64 indices, read and written).

Each program sums a fixed range of a row into PIVOTS partial masses; torch adds the partials. The order of every
sum is fixed by the shapes, so the same device repeats the same thresholds exactly.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from .triton_decode import device_guard, triton

if triton is not None:
    import triton.language as tl

PIVOTS = 16
BLOCK = 256  # words a program reads per iteration: a [BLOCK, PIVOTS] comparison is 32 numbers a thread
BLOCKS_PER_PROGRAM = 16  # 4,096 words a program: 66 programs a wt103 row
NUM_WARPS = 4


@functools.cache
def jit_kernel() -> Any:
    # The vocabulary and a row's stride are fixed per model, the parts per call: none is worth a variant.
    @triton.jit(do_not_specialize=["V", "row_stride", "parts"])
    def masses_above(
        logits,  # [N, V] float32, rows row_stride apart
        normaliser,  # [N] float32: each row's logsumexp
        pivots,  # [N, J] int32 keys
        out,  # [N, parts, J] float32: each program's partial masses
        V,
        row_stride,
        parts,
        J: tl.constexpr,
        BLOCK: tl.constexpr,
        ITERS: tl.constexpr,
    ):
        row = tl.program_id(0)
        part = tl.program_id(1)
        ways = tl.arange(0, J)
        pivot = tl.load(pivots + row * J + ways)  # [J]
        lse = tl.load(normaliser + row)
        base = logits + row.to(tl.int64) * row_stride
        acc = tl.zeros((J,), tl.float32)
        for i in range(ITERS):
            words = (part * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
            ok = words < V
            x = tl.load(base + words, mask=ok, other=float("-inf"))  # [BLOCK]
            # The float's key: its bits, negatives' magnitude flipped, so that keys order as floats; -0.0 is 0.
            bits = x.to(tl.int32, bitcast=True)
            key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
            key = tl.where(x == 0.0, 0, key)
            weight = tl.where(ok, tl.exp(x - lse), 0.0)  # [BLOCK] probabilities
            acc += tl.sum(tl.where(key[:, None] > pivot[None, :], weight[:, None], 0.0), axis=0)  # [J]
        tl.store(out + (row * parts + part) * J + ways, acc)

    return masses_above


def masses_above(logits: Tensor, normaliser: Tensor, pivots: Tensor) -> Tensor:
    """[N, V] float32 logits, [N, 1] their logsumexp, [N, J] int keys -> [N, J]: per row and pivot, the mass of
    the tokens whose key is above the pivot. Launched under the tensors' device; no host synchronisation."""
    logits = logits.contiguous()  # a row's words side by side (rows may sit apart)
    n, vocab = logits.shape
    ways = pivots.size(1)
    parts = -(-vocab // (BLOCK * BLOCKS_PER_PROGRAM))
    with device_guard(logits.device):
        partial = torch.empty((n, parts, ways), dtype=torch.float32, device=logits.device)
        jit_kernel()[(n, parts)](
            logits,
            normaliser.float().contiguous(),
            pivots.to(torch.int32).contiguous(),
            partial,
            vocab,
            logits.stride(0),
            parts,
            J=ways,
            BLOCK=BLOCK,
            ITERS=BLOCKS_PER_PROGRAM,
            num_warps=NUM_WARPS,
        )
    return partial.sum(1)


def warm_up(device: torch.device) -> None:
    """Compiles the kernel at start-up (its one variant)."""
    logits = torch.zeros((1, 8), device=device)
    masses_above(logits, logits[:, :1], torch.zeros((1, PIVOTS), dtype=torch.int32, device=device))
