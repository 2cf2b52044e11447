"""Sampling a decoding step's tokens on the GPU (Triton): what `txl.sampling.sample_rows` computes, in a fixed
number of launches whatever the batch, none of them waiting for the host.

- `row_max`: each row's largest log-prob and its first index (the greedy token);
- `nucleus_pass`, top-p only: one pass of `txl.nucleus.threshold_search` over every row: the tempered weights
  above PIVOTS pivot keys and in all, summed over the row, and the row's interval of keys narrowed; eight passes
  leave the threshold (keys of 2**32 values, cut into PIVOTS + 1 parts a pass). The mass is compared unnormalised
  (weight above < top_p x total weight), so no pass is needed for the normaliser;
- `draw`: per row, the kept tokens' weights (tempered, below the top-k and top-p thresholds dropped) summed by
  chunk; the row's token is the first whose cumulative weight exceeds u x total, u its counter-based number (by
  inverse CDF in vocabulary order, as the torch path draws; the number is `txl.sampling.counter_uniform` of the
  row's seed and token index, the same integer arithmetic in the kernel), or the best token for a greedy row;
  its log-prob, and both as float64 into the iteration's read-back buffer.

Each kernel splits a row over programs of CHUNK words (a wt103 row is 66 of them); the last program of a row to
finish (`triton.common` semaphores) combines the chunks in order, so the same device gives the same tokens at
every run. Tempering is (log p - max) / T in float32, rounded as torch rounds it, so the keys and the top-k
threshold are the torch path's; sums are taken in another order than torch's, so a number that falls within
rounding of a boundary between two tokens (or a token at the edge of top-p) may go the other way.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch
from torch import Tensor

from . import common
from .common import device_guard, semaphores, triton

if triton is not None:
    import triton.language as tl

PIVOTS = 16
PASSES = 8  # txl.nucleus.search_passes(PIVOTS)
CHUNK = 4096  # words a program reads
BLOCK = 1024  # words per iteration (the nucleus pass: PASS_BLOCK, against every pivot)
PASS_BLOCK = 256
CHUNK_BLOCK = 128  # chunk sums the last program reads per iteration
NUM_WARPS = 4
NEG_INF_KEY = -1 - 0x7F800000  # txl.nucleus's key of -inf

if triton is not None:

    @triton.jit
    def _tempered(lp, top, temperature):
        """(log p - max) / T, rounded as torch's float32 division rounds it."""
        return tl.math.div_rn(lp - top, temperature)

    @triton.jit
    def _key(x):
        """txl.nucleus.float_keys: the float's bits, negatives' magnitude flipped (-0.0 as 0.0)."""
        bits = x.to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        return tl.where(x == 0.0, 0, key)

    @triton.jit
    def _mix32(x):
        """txl.sampling._mix32 on int64 values in [0, 2**32): the same integer arithmetic, so the same bits."""
        x = x ^ (x >> 16)
        x = (x * 0x45D9F3B) & 0xFFFFFFFF
        x = x ^ (x >> 16)
        x = (x * 0x45D9F3B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    @triton.jit
    def _counter_uniform(seed, counter):
        """txl.sampling.counter_uniform of one row: a float64 in [0, 1) with 53 random bits."""
        lo = seed & 0xFFFFFFFF
        hi = (seed >> 32) & 0xFFFFFFFF
        h = _mix32(lo ^ _mix32(hi ^ _mix32((counter & 0xFFFFFFFF) ^ 0x9E3779B9)))
        a = _mix32(h ^ 0x85EBCA6B) >> 5  # 27 bits
        b = _mix32(h ^ 0xC2B2AE35) >> 6  # 26 bits
        return (a * 67108864 + b).to(tl.float64) / 9007199254740992.0

    @triton.jit
    def _unkey(key):
        """txl.nucleus.key_to_float."""
        bits = key.to(tl.int32)
        return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.float32, bitcast=True)


@functools.cache
def jit_kernels() -> tuple[Any, Any, Any]:
    @triton.jit(do_not_specialize=["V", "chunks"])
    def row_max(
        lp,  # [N, V] float32
        chunk_best,  # [N, chunks] float32
        chunk_arg,  # [N, chunks] int64
        sem,
        best,  # [N] float32 out
        best_at,  # [N] int64 out: the first index of the best
        V,
        chunks,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
        CHUNK_BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        base = lp + row.to(tl.int64) * V
        top = tl.full((), float("-inf"), tl.float32)
        at = tl.zeros((), tl.int64)
        for w0 in range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK):
            w = w0 + tl.arange(0, BLOCK)
            x = tl.load(base + w, mask=w < V, other=float("-inf"))
            m = tl.max(x, axis=0)
            if m > top:  # strictly: the first index of the best stays
                top = m
                at = w0 + tl.argmax(x, axis=0).to(tl.int64)
        tl.store(chunk_best + row * chunks + chunk, top)
        tl.store(chunk_arg + row * chunks + chunk, at)
        tl.debug_barrier()  # every thread's stores before the count
        if tl.atomic_add(sem + row, 1, sem="acq_rel") == chunks - 1:
            top = tl.full((), float("-inf"), tl.float32)
            at = tl.zeros((), tl.int64)
            for c0 in range(0, chunks, CHUNK_BLOCK):
                c = c0 + tl.arange(0, CHUNK_BLOCK)
                ok = c < chunks
                found = tl.load(
                    chunk_best + row * chunks + c, mask=ok, other=float("-inf"), cache_modifier=".cg"
                )
                m = tl.max(found, axis=0)
                if m > top:
                    top = m
                    first = tl.argmax(found, axis=0)
                    at = tl.load(chunk_arg + row * chunks + c0 + first, cache_modifier=".cg")
            tl.store(best + row, top)
            tl.store(best_at + row, at)
            tl.atomic_xchg(sem + row, 0)

    @triton.jit(do_not_specialize=["V", "chunks"])
    def nucleus_pass(
        lp,  # [N, V] float32
        best,  # [N] float32: each row's largest log-prob
        temperature,  # [N] float32
        top_p,  # [N] float32
        lo,  # [N] int64: the interval (lo, hi] of keys that holds the threshold, narrowed by each pass
        hi,
        above,  # [N, chunks, J] float32: each chunk's weight above each pivot
        total,  # [N, chunks] float32: each chunk's weight
        sem,
        V,
        chunks,
        FIRST: tl.constexpr,  # the first pass: the interval starts below every key, up to the best's (0.0)
        J: tl.constexpr,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
        CHUNK_BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        if FIRST:
            low = tl.full((), -1 - 0x7F800000 - 1, tl.int64)
            high = tl.zeros((), tl.int64)  # the best tempered logit is 0.0, whose key is 0
        else:
            low = tl.load(lo + row)
            high = tl.load(hi + row)
        cuts = tl.arange(0, J).to(tl.int64) + 1
        pivots = low + (high - low) * cuts // (J + 1)  # [J] increasing, in [lo, hi)
        top = tl.load(best + row)
        t = tl.load(temperature + row)
        base = lp + row.to(tl.int64) * V
        mass = tl.zeros((J,), tl.float32)
        weight_sum = tl.zeros((BLOCK,), tl.float32)
        for w0 in range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK):
            w = w0 + tl.arange(0, BLOCK)
            ok = w < V
            x = _tempered(tl.load(base + w, mask=ok, other=float("-inf")), top, t)
            weight = tl.where(ok, tl.exp(x), 0.0)
            key = _key(x).to(tl.int64)
            mass += tl.sum(tl.where(key[:, None] > pivots[None, :], weight[:, None], 0.0), axis=0)
            weight_sum += weight
        tl.store(above + (row * chunks + chunk) * J + tl.arange(0, J), mass)
        tl.store(total + row * chunks + chunk, tl.sum(weight_sum, axis=0))
        tl.debug_barrier()  # every thread's stores before the count
        if tl.atomic_add(sem + row, 1, sem="acq_rel") == chunks - 1:
            mass = tl.zeros((J,), tl.float32)
            whole = tl.zeros((), tl.float32)
            for c0 in range(0, chunks, CHUNK_BLOCK):  # CHUNK_BLOCK chunks' figures a read (a wt103 row: one)
                c = c0 + tl.arange(0, CHUNK_BLOCK)
                ok = c < chunks
                found = tl.load(
                    above + (row * chunks + c[:, None]) * J + tl.arange(0, J)[None, :],
                    mask=ok[:, None],
                    other=0.0,
                    cache_modifier=".cg",
                )  # [CHUNK_BLOCK, J]
                mass += tl.sum(found, axis=0)
                whole += tl.sum(tl.load(total + row * chunks + c, mask=ok, other=0.0, cache_modifier=".cg"))
            # As threshold_search: the mass above a pivot falls as the pivot rises; keep the part where it
            # crosses top_p of the whole.
            below = mass < tl.load(top_p + row) * whole  # [J]
            count = tl.sum(below.to(tl.int32), axis=0)
            first = J - count  # the first pivot whose mass above is below the target (J: none)
            active = high - low > 1
            index = tl.arange(0, J)
            if active & (count > 0):
                high = tl.sum(tl.where(index == tl.minimum(first, J - 1), pivots, 0), axis=0)
            if active & (first > 0):
                low = tl.sum(tl.where(index == first - 1, pivots, 0), axis=0)
            tl.store(lo + row, low)
            tl.store(hi + row, high)
            tl.atomic_xchg(sem + row, 0)

    @triton.jit(do_not_specialize=["V", "chunks", "k_width"])
    def draw(
        lp,  # [N, V] float32
        best,  # [N] float32
        best_at,  # [N] int64
        temperature,  # [N] float32
        greedy,  # [N] bool
        top_k,  # [N] int64 (V where unlimited)
        kth,  # [N, k_width] float32: each row's best log-probs, best first (HAS_TOP_K)
        hi,  # [N] int64: top-p's threshold key (HAS_TOP_P)
        uniform,  # [N] float64 (HAS_UNIFORM), else computed from seeds and counters
        seeds,  # [N] int64
        counters,  # [N] int64
        chunk_sum,  # [N, chunks] float32
        sem,
        tokens,  # [N] int64 out
        logprobs,  # [N] float32 out
        readback,  # [N, 2] float64 out (HAS_READBACK): token, log-prob
        V,
        chunks,
        k_width,
        HAS_TOP_K: tl.constexpr,
        HAS_TOP_P: tl.constexpr,
        HAS_READBACK: tl.constexpr,
        HAS_UNIFORM: tl.constexpr,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
        CHUNK_BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        top = tl.load(best + row)
        t = tl.load(temperature + row)
        # The smallest tempered logit a row keeps (the torch path's keep_thresholds).
        threshold = tl.full((), float("-inf"), tl.float32)
        if HAS_TOP_K:
            k = tl.load(top_k + row)
            if k < V:
                at_k = tl.minimum(k, k_width) - 1
                threshold = _tempered(tl.load(kth + row * k_width + at_k), top, t)
        if HAS_TOP_P:
            threshold = tl.maximum(threshold, _unkey(tl.maximum(tl.load(hi + row), -1 - 0x7F800000)))
        base = lp + row.to(tl.int64) * V
        acc = tl.zeros((BLOCK,), tl.float32)
        for w0 in range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK):
            w = w0 + tl.arange(0, BLOCK)
            ok = w < V
            x = _tempered(tl.load(base + w, mask=ok, other=float("-inf")), top, t)
            acc += tl.where(ok & (x >= threshold), tl.exp(x), 0.0)
        tl.store(chunk_sum + row * chunks + chunk, tl.sum(acc, axis=0))
        tl.debug_barrier()  # every thread's stores before the count
        if tl.atomic_add(sem + row, 1, sem="acq_rel") == chunks - 1:
            token = tl.load(best_at + row)
            if tl.load(greedy + row) == 0:
                lanes = tl.arange(0, CHUNK_BLOCK)
                # The whole kept weight: the chunks' sums accumulated in order.
                carry = tl.zeros((), tl.float32)
                for c0 in range(0, chunks, CHUNK_BLOCK):
                    sums = tl.load(
                        chunk_sum + row * chunks + c0 + lanes,
                        mask=c0 + lanes < chunks,
                        other=0.0,
                        cache_modifier=".cg",
                    )
                    carry = carry + tl.sum(
                        tl.where(lanes == CHUNK_BLOCK - 1, tl.cumsum(sums, axis=0), 0.0), axis=0
                    )
                if HAS_UNIFORM:
                    u = tl.load(uniform + row)
                else:
                    u = _counter_uniform(tl.load(seeds + row), tl.load(counters + row))
                target = u.to(tl.float32) * carry
                # The first chunk whose cumulative weight exceeds the target (else the last with any weight: the
                # target rounded up to the whole), and the weight before it.
                carry = tl.zeros((), tl.float32)
                chosen = tl.full((), -1, tl.int64)
                before = tl.zeros((), tl.float32)
                last = tl.zeros((), tl.int64)
                for c0 in range(0, chunks, CHUNK_BLOCK):
                    c = c0 + lanes
                    sums = tl.load(
                        chunk_sum + row * chunks + c, mask=c < chunks, other=0.0, cache_modifier=".cg"
                    )
                    cumulative = carry + tl.cumsum(sums, axis=0)
                    hit = tl.min(tl.where(cumulative > target, lanes, CHUNK_BLOCK), axis=0)
                    if (chosen < 0) & (hit < CHUNK_BLOCK):
                        chosen = (c0 + hit).to(tl.int64)
                        before = tl.where(
                            hit == 0, carry, tl.sum(tl.where(lanes == hit - 1, cumulative, 0.0), axis=0)
                        )
                    last = tl.maximum(last, tl.max(tl.where(sums > 0.0, c, 0), axis=0).to(tl.int64))
                    carry = tl.sum(tl.where(lanes == CHUNK_BLOCK - 1, cumulative, 0.0), axis=0)
                if chosen < 0:
                    chosen = last
                    before = float(
                        "-inf"
                    )  # nothing exceeds the target (it rounded to the whole): the last kept word
                # Within the chosen chunk: the first word whose cumulative weight exceeds the target, else its last
                # kept word.
                found = tl.full((), -1, tl.int64)
                kept = tl.full((), -1, tl.int64)
                carry = before
                for at in range(chosen * CHUNK, chosen * CHUNK + CHUNK, BLOCK):
                    words = at + tl.arange(0, BLOCK)
                    inside = words < V
                    x2 = _tempered(tl.load(base + words, mask=inside, other=float("-inf")), top, t)
                    weight = tl.where(inside & (x2 >= threshold), tl.exp(x2), 0.0)
                    cumulative = carry + tl.cumsum(weight, axis=0)
                    hit = tl.min(tl.where(cumulative > target, words, V), axis=0).to(tl.int64)
                    if (found < 0) & (hit < V):
                        found = hit
                    kept = tl.maximum(kept, tl.max(tl.where(weight > 0.0, words, -1), axis=0).to(tl.int64))
                    carry = tl.sum(tl.where(tl.arange(0, BLOCK) == BLOCK - 1, cumulative, 0.0), axis=0)
                token = tl.where(found >= 0, found, tl.maximum(kept, 0))
            logprob = tl.load(base + token)
            tl.store(tokens + row, token)
            tl.store(logprobs + row, logprob)
            if HAS_READBACK:
                tl.store(readback + row * 2, token.to(tl.float64))
                tl.store(readback + row * 2 + 1, logprob.to(tl.float64))
            tl.atomic_xchg(sem + row, 0)

    return row_max, nucleus_pass, draw


def sample(
    log_probs: Tensor,
    temperature: Tensor,
    greedy: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    uniform: Tensor | None,
    seeds: Tensor,
    counters: Tensor,
    *,
    max_top_k: int,
    any_top_p: bool,
    readback: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """[N, V] float32 log-probs and each row's parameters (as `txl.sampling.RowParams` holds them; `uniform` [N]
    float64, or None: the counter hash of `seeds` and `counters`, computed in the kernel) -> (tokens [N] int64,
    their log-probs [N] float32); with `readback` [N, 2] float64, both written there too. 2 launches, plus one for
    top-k's selection and PASSES for top-p's search."""
    n, vocab = log_probs.shape
    log_probs = log_probs.contiguous()
    chunks = -(-vocab // CHUNK)
    device = log_probs.device
    row_max, nucleus_pass, draw_kernel = jit_kernels()
    with device_guard(device):
        sem = semaphores(device, n)
        chunk_best = torch.empty((n, chunks), dtype=torch.float32, device=device)
        chunk_arg = torch.empty((n, chunks), dtype=torch.int64, device=device)
        best = torch.empty(n, dtype=torch.float32, device=device)
        best_at = torch.empty(n, dtype=torch.int64, device=device)
        common.launch(
            row_max,
            (n, chunks),
            log_probs,
            chunk_best,
            chunk_arg,
            sem,
            best,
            best_at,
            vocab,
            chunks,
            CHUNK=CHUNK,
            BLOCK=BLOCK,
            CHUNK_BLOCK=CHUNK_BLOCK,
            num_warps=NUM_WARPS,
        )
        kth: Tensor = best
        if max_top_k:
            kth = torch.topk(log_probs, max_top_k, dim=-1).values  # [N, kmax] best first
        hi: Tensor = best_at
        if any_top_p:
            lo = torch.empty(n, dtype=torch.int64, device=device)
            hi = torch.empty(n, dtype=torch.int64, device=device)
            above = torch.empty((n, chunks, PIVOTS), dtype=torch.float32, device=device)
            total = torch.empty((n, chunks), dtype=torch.float32, device=device)
            for step in range(PASSES):
                common.launch(
                    nucleus_pass,
                    (n, chunks),
                    log_probs,
                    best,
                    temperature,
                    top_p,
                    lo,
                    hi,
                    above,
                    total,
                    sem,
                    vocab,
                    chunks,
                    FIRST=step == 0,
                    J=PIVOTS,
                    CHUNK=CHUNK,
                    BLOCK=PASS_BLOCK,
                    CHUNK_BLOCK=CHUNK_BLOCK,
                    num_warps=NUM_WARPS,
                )
        tokens = torch.empty(n, dtype=torch.int64, device=device)
        logprobs = torch.empty(n, dtype=torch.float32, device=device)
        common.launch(
            draw_kernel,
            (n, chunks),
            log_probs,
            best,
            best_at,
            temperature,
            greedy,
            top_k,
            kth,
            hi,
            uniform if uniform is not None else best,
            seeds,
            counters,
            chunk_best,  # reused: each chunk's kept weight
            sem,
            tokens,
            logprobs,
            readback if readback is not None else logprobs,
            vocab,
            chunks,
            kth.size(-1) if max_top_k else 1,
            HAS_TOP_K=max_top_k > 0,
            HAS_TOP_P=any_top_p,
            HAS_READBACK=readback is not None,
            HAS_UNIFORM=uniform is not None,
            CHUNK=CHUNK,
            BLOCK=BLOCK,
            CHUNK_BLOCK=CHUNK_BLOCK,
            num_warps=NUM_WARPS,
        )
    return tokens, logprobs


def nucleus_thresholds(log_probs: Tensor, temperature: Tensor, top_p: Tensor) -> Tensor:
    """[N, V] float32 log-probs, [N] temperatures and top_p -> [N] the smallest tempered logit top-p keeps: what
    `sample`'s passes find (for tests, against the torch path's search and a full sort)."""
    n, vocab = log_probs.shape
    log_probs = log_probs.contiguous()
    chunks = -(-vocab // CHUNK)
    device = log_probs.device
    row_max, nucleus_pass, _ = jit_kernels()
    sem = semaphores(device, n)
    best = torch.empty(n, dtype=torch.float32, device=device)
    best_at = torch.empty(n, dtype=torch.int64, device=device)
    chunk_best = torch.empty((n, chunks), dtype=torch.float32, device=device)
    chunk_arg = torch.empty((n, chunks), dtype=torch.int64, device=device)
    with device_guard(device):
        common.launch(row_max, (n, chunks), log_probs, chunk_best, chunk_arg, sem, best, best_at, vocab, chunks,
               CHUNK=CHUNK, BLOCK=BLOCK, CHUNK_BLOCK=CHUNK_BLOCK, num_warps=NUM_WARPS)  # fmt: skip
        lo = torch.empty(n, dtype=torch.int64, device=device)
        hi = torch.empty(n, dtype=torch.int64, device=device)
        above = torch.empty((n, chunks, PIVOTS), dtype=torch.float32, device=device)
        total = torch.empty((n, chunks), dtype=torch.float32, device=device)
        for step in range(PASSES):
            common.launch(nucleus_pass, (n, chunks), log_probs, best, temperature, top_p, lo, hi, above, total, sem,
                   vocab, chunks, FIRST=step == 0, J=PIVOTS, CHUNK=CHUNK, BLOCK=PASS_BLOCK,
                   CHUNK_BLOCK=CHUNK_BLOCK, num_warps=NUM_WARPS)  # fmt: skip
    bits = hi.clamp(min=NEG_INF_KEY).to(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).view(torch.float32)


def warm_up(device: torch.device) -> None:
    """Compiles every variant sampling launches (greedy and temperature, top-k, top-p), at start-up."""
    log_probs = torch.log_softmax(torch.zeros((1, 8), device=device), dim=-1)
    one = torch.ones(1, device=device)
    for top_k, top_p, read_back in itertools.product((0, 2), (False, True), (False, True)):
        sample(
            log_probs,
            one,
            torch.zeros(1, dtype=torch.bool, device=device),
            torch.full((1,), 2 if top_k else 8, dtype=torch.int64, device=device),
            one * (0.5 if top_p else 1.0),
            None,  # what graphs and CUDA's eager steps give: the hash in the kernel
            torch.zeros(1, dtype=torch.int64, device=device),
            torch.zeros(1, dtype=torch.int64, device=device),
            max_top_k=top_k,
            any_top_p=top_p,
            readback=torch.zeros((1, 2), dtype=torch.float64, device=device) if read_back else None,
        )
