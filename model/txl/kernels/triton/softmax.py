"""The projected adaptive softmax's log-probabilities from its clusters' logits, in two Triton kernels (Grave et
al., 2017): log p(w) = head(w) for a head word, head(cluster i) + tail_i(w) for a word of tail cluster i, each
part a log-softmax over its own logits.

The torch path takes several launches per cluster after its products (the cast to float32, the log-softmax, the
cluster's head log-prob added, the copy into the vocabulary). Here the logits come from the same products as the
torch path's (`txl.adaptive`: the same calls, so the same numbers), and:

1. `stats`: each program reads a chunk of one part's logits and keeps the chunk's maximum and sum of
   exponentials; the last of a row's programs (`triton.common` semaphores) combines them part by part, in chunk
   order (the head with its cluster logits), into one number per part: what to add to its logits;
2. `write`: each program writes its chunk's log-probabilities, logit + that number, as float32.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from . import common
from .common import device_guard, semaphores, triton

MAX_PARTS = 4  # the head and three tail clusters (wt103); more take the torch path
CHUNK = 4096  # words a program reads
BLOCK = 1024  # words a program reads per iteration
STATS_BLOCK = 128  # chunk statistics the last program reads per iteration
NUM_WARPS = 4

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _part(chunk, s1, s2, s3):
        """The part a chunk falls in (parts' first chunks s1 <= s2 <= s3; a missing part starts at the end)."""
        return tl.where(chunk >= s1, 1, 0) + tl.where(chunk >= s2, 1, 0) + tl.where(chunk >= s3, 1, 0)

    @triton.jit
    def _pick(part, a0, a1, a2, a3):
        return tl.where(part == 0, a0, tl.where(part == 1, a1, tl.where(part == 2, a2, a3)))

    @triton.jit
    def _load_part(part, row, w, ok, x0, x1, x2, x3, n0, n1, n2, n3):
        """A part's logits at words w of `row`, in float32 (-inf beyond the part)."""
        if part == 0:
            x = tl.load(x0 + row.to(tl.int64) * n0 + w, mask=ok, other=float("-inf"))
        elif part == 1:
            x = tl.load(x1 + row.to(tl.int64) * n1 + w, mask=ok, other=float("-inf"))
        elif part == 2:
            x = tl.load(x2 + row.to(tl.int64) * n2 + w, mask=ok, other=float("-inf"))
        else:
            x = tl.load(x3 + row.to(tl.int64) * n3 + w, mask=ok, other=float("-inf"))
        return x.to(tl.float32)


@functools.cache
def jit_kernels() -> tuple[Any, Any]:
    @triton.jit(do_not_specialize=["n0", "n1", "n2", "n3", "s1", "s2", "s3", "chunks"])
    def stats(
        x0,  # [N, n_i] each part's logits (model dtype)
        x1,
        x2,
        x3,
        clusters,  # [N, PARTS - 1] the head's logit of each tail cluster
        chunk_max,  # [N, chunks] float32
        chunk_sum,  # [N, chunks] float32
        sem,
        shifts,  # [N, 4] float32 out: what each part's logits add to become log-probabilities
        n0,
        n1,
        n2,
        n3,
        s1,  # first chunk of parts 1, 2, 3 (`chunks` for a part that is not there)
        s2,
        s3,
        chunks,
        PARTS: tl.constexpr,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
        STATS_BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        part = _part(chunk, s1, s2, s3)
        width = _pick(part, n0, n1, n2, n3)
        words0 = (chunk - _pick(part, 0, s1, s2, s3)) * CHUNK
        offsets = tl.arange(0, BLOCK)
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        for w0 in range(words0, words0 + CHUNK, BLOCK):
            w = w0 + offsets
            best = tl.maximum(best, _load_part(part, row, w, w < width, x0, x1, x2, x3, n0, n1, n2, n3))
        top = tl.max(best, axis=0)  # finite: every chunk holds a word
        total = tl.zeros((BLOCK,), tl.float32)
        for w0 in range(words0, words0 + CHUNK, BLOCK):
            w = w0 + offsets
            total += tl.exp(_load_part(part, row, w, w < width, x0, x1, x2, x3, n0, n1, n2, n3) - top)
        tl.store(chunk_max + row * chunks + chunk, top)
        tl.store(chunk_sum + row * chunks + chunk, tl.sum(total, axis=0))
        tl.debug_barrier()  # every thread's stores before the count
        if (
            tl.atomic_add(sem + row, 1, sem="acq_rel") == chunks - 1
        ):  # the row's last chunk: each part's numbers
            tails = tl.arange(0, 4)
            head_clusters = tl.load(
                clusters + row * (PARTS - 1) + tails, mask=tails < PARTS - 1, other=float("-inf")
            ).to(tl.float32)
            lse_head = tl.zeros((), tl.float32)
            for p in tl.static_range(PARTS):
                if p == 0:
                    lo = 0
                    hi = s1
                elif p == 1:
                    lo = s1
                    hi = s2
                elif p == 2:
                    lo = s2
                    hi = s3
                else:
                    lo = s3
                    hi = chunks
                m = tl.full((), float("-inf"), tl.float32)
                if p == 0:  # the head also holds one logit per tail cluster
                    m = tl.max(head_clusters, axis=0)
                for c0 in range(lo, hi, STATS_BLOCK):
                    c = c0 + tl.arange(0, STATS_BLOCK)
                    found = tl.load(
                        chunk_max + row * chunks + c, mask=c < hi, other=float("-inf"), cache_modifier=".cg"
                    )
                    m = tl.maximum(m, tl.max(found, axis=0))
                z = tl.zeros((), tl.float32)
                if p == 0:
                    z = tl.sum(tl.exp(head_clusters - m), axis=0)
                for c0 in range(lo, hi, STATS_BLOCK):
                    c = c0 + tl.arange(0, STATS_BLOCK)
                    ok = c < hi
                    found = tl.load(
                        chunk_max + row * chunks + c, mask=ok, other=float("-inf"), cache_modifier=".cg"
                    )
                    sums = tl.load(chunk_sum + row * chunks + c, mask=ok, other=0.0, cache_modifier=".cg")
                    z += tl.sum(tl.where(ok, sums * tl.exp(found - m), 0.0), axis=0)
                if p == 0:
                    lse_head = m + tl.log(z)
                    tl.store(shifts + row * 4, -lse_head)
                else:  # log p(cluster p) in the head, less the tail's own log-normaliser
                    cluster = tl.sum(tl.where(tails == p - 1, head_clusters, 0.0), axis=0)
                    tl.store(shifts + row * 4 + p, (cluster - lse_head) - (m + tl.log(z)))
            tl.atomic_xchg(sem + row, 0)  # zero again for the next launch

    @triton.jit(do_not_specialize=["n0", "n1", "n2", "n3", "s1", "s2", "s3", "o1", "o2", "o3", "vocab"])
    def write(
        x0,
        x1,
        x2,
        x3,
        shifts,  # [N, 4] float32
        out,  # [N, vocab] float32
        n0,
        n1,
        n2,
        n3,
        s1,
        s2,
        s3,
        o1,  # each tail part's first word in the vocabulary
        o2,
        o3,
        vocab,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        part = _part(chunk, s1, s2, s3)
        width = _pick(part, n0, n1, n2, n3)
        start = _pick(part, 0, o1, o2, o3)
        shift = tl.load(shifts + row * 4 + part)
        words0 = (chunk - _pick(part, 0, s1, s2, s3)) * CHUNK
        offsets = tl.arange(0, BLOCK)
        for w0 in range(words0, words0 + CHUNK, BLOCK):
            w = w0 + offsets
            ok = w < width
            x = _load_part(part, row, w, ok, x0, x1, x2, x3, n0, n1, n2, n3)
            tl.store(out + row.to(tl.int64) * vocab + start + w, x + shift, mask=ok)

    return stats, write


def adaptive_log_probs(logits: Sequence[Tensor], clusters: Tensor | None) -> Tensor | None:
    """Each part's logits [N, n_i] (the head's words first, then each tail cluster's, with their biases) and the
    head's cluster logits [N, parts - 1] -> [N, vocab] float32 log-probabilities. None where there are more than
    MAX_PARTS parts (the caller takes the torch path)."""
    parts = len(logits)
    if parts > MAX_PARTS:
        return None
    logits = [x.contiguous() for x in logits]
    n = logits[0].size(0)
    widths = [x.size(1) for x in logits]
    vocab = sum(widths)
    chunk_counts = [-(-w // CHUNK) for w in widths]
    starts = [sum(chunk_counts[:i]) for i in range(1, parts)]
    chunks = sum(chunk_counts)
    device = logits[0].device
    padded_x = [*logits, *[logits[0]] * (MAX_PARTS - parts)]
    padded_n = [*widths, *[0] * (MAX_PARTS - parts)]
    padded_s = [*starts, *[chunks] * (MAX_PARTS - parts)]
    padded_o = [*(sum(widths[:i]) for i in range(1, parts)), *[vocab] * (MAX_PARTS - parts)]
    stats, write = jit_kernels()
    with device_guard(device):
        chunk_max = torch.empty((n, chunks), dtype=torch.float32, device=device)
        chunk_sum = torch.empty_like(chunk_max)
        shifts = torch.empty((n, 4), dtype=torch.float32, device=device)
        out = torch.empty((n, vocab), dtype=torch.float32, device=device)
        common.launch(
            stats,
            (n, chunks),
            *padded_x,
            clusters.contiguous() if clusters is not None else shifts,
            chunk_max,
            chunk_sum,
            semaphores(device, n),
            shifts,
            *padded_n,
            *padded_s,
            chunks,
            PARTS=parts,
            CHUNK=CHUNK,
            BLOCK=BLOCK,
            STATS_BLOCK=STATS_BLOCK,
            num_warps=NUM_WARPS,
        )
        common.launch(
            write,
            (n, chunks),
            *padded_x,
            shifts,
            out,
            *padded_n,
            *padded_s,
            *padded_o,
            vocab,
            CHUNK=CHUNK,
            BLOCK=BLOCK,
            num_warps=NUM_WARPS,
        )
    return out
