"""Top-p's threshold without sorting the vocabulary: per row, the smallest logit v whose better tokens (logit > v)
hold less than top_p of the mass. Keeping every token >= v keeps the smallest most-likely set whose mass reaches
top_p, with the tokens tied at its edge (whatever order a sort would have given them); the best token always
stays. Sorting the [64, 267,735] logits of a wt103 step for it is what this replaces.

Three ways to the same threshold, all exact:
- on a CPU, the best candidates first (a partial selection, `torch.topk`): they decide every row whose nucleus
  ends among them, which the host checks, widening once for the others;
- on a CPU, for rows with a wider nucleus (a flat distribution), a search that cuts the range of logits still in
  question into parts and keeps the part that holds the threshold (`_narrowing_search`), a few steps;
- off the CPU, a search of a fixed number of passes over every row, with no host decision, so that a CUDA graph
  captures it (`threshold_search`, on keys: each float32 logit's bits as an int32, ordered as the floats are):
  torch weighs one pivot a pass (32 passes); where decoding takes the Triton kernels, sampling runs the same
  search with 16 pivots a pass (8 passes, one launch each: `txl.kernels.triton.sampling`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

# A CPU looks at the best NUCLEUS_CANDIDATES words first; rows whose nucleus they do not cover look at 8 times as
# many while that stays a small part of the vocabulary (1/32: a partial selection of more costs as much as the
# search), then take the search.
NUCLEUS_CANDIDATES = 1024
WIDEST_SELECTION = 1 / 32
NARROWING_PARTS = 256  # parts a step of a CPU row's search cuts its range of logits into


def nucleus_thresholds(logits: Tensor, top_p: Tensor) -> Tensor:
    """[N, V] logits (tempered), [N] top_p -> [N, 1] the smallest logit each row keeps."""
    n, vocab = logits.shape
    normaliser = torch.logsumexp(logits, dim=-1, keepdim=True)  # [N, 1]
    if logits.device.type != "cpu":
        return searched_nucleus_thresholds(logits, normaliser, top_p)
    threshold = torch.full((n, 1), -math.inf)
    todo = torch.arange(n)  # rows not decided yet
    k = min(vocab, NUCLEUS_CANDIDATES)
    while True:
        # All rows in the first round, without a copy of the logits (it would cost more than the selection).
        every_row = todo.numel() == n
        values = torch.topk(logits if every_row else logits.index_select(0, todo), k).values  # [n', k]
        probs = torch.exp(values - (normaliser if every_row else normaliser.index_select(0, todo)))
        before = probs.cumsum(-1) - probs  # [n', k]: mass of the better candidates
        limit = top_p.index_select(0, todo)[:, None]
        kept = (before < limit).sum(-1, keepdim=True).clamp(min=1)  # [n', 1] tokens kept
        # The candidates decide a row when its nucleus ends among them: their mass reaches top_p.
        decided = ((before[:, -1:] + probs[:, -1:]) >= limit)[:, 0] | (k == vocab)
        threshold[todo[decided]] = values.gather(1, kept - 1)[decided]
        todo = todo[~decided]
        if not todo.numel():  # a host decision: free on a CPU
            return threshold
        k = min(vocab, k * 8)
        if k > max(NUCLEUS_CANDIDATES, vocab * WIDEST_SELECTION):
            break
    wide = logits.index_select(0, todo)
    probs = torch.exp(wide - normaliser.index_select(0, todo))  # [n', V]
    threshold[todo] = _narrowing_search(wide, probs, top_p.index_select(0, todo).double())[:, None]
    return threshold


def _narrowing_search(logits: Tensor, probs: Tensor, target: Tensor) -> Tensor:
    """Rows on a CPU: [n, V] logits, [n, V] probabilities, [n] targets -> [n]: per row, the smallest logit v
    with mass(logits > v) < target (as `threshold_search`, but on the values).

    Each step cuts the range of a row's tokens still in question into NARROWING_PARTS parts of equal width, adds
    the masses (and counts) of the parts in one pass (`bincount`), and keeps the lowest non-empty part whose
    better tokens hold less than the target: the answer's. The mass above it is carried as a number, and only its
    tokens go on. A token's part is float arithmetic that never decreases as the logit rises, so tied logits
    share a part and the parts are ranges of logits, whatever the rounding; the smallest and largest token of a
    row always fall in different parts, so every step settles something. A flat row of 267,735 words keeps
    thousands after the first step and is settled within a few. The steps are batched over the rows: on a
    shared 2-core machine every parallel torch operation can wait for the second core."""
    n, vocab = logits.shape
    parts = NARROWING_PARTS
    rows = torch.arange(n)
    bound = torch.finfo(torch.float32).max / 4
    line, weight = logits, probs  # the tokens in question: [n, V] at first, then flat
    owner = rows[:, None]  # each token's row
    above = torch.zeros(n, dtype=torch.float64)  # mass of each row's tokens above those in question
    answer = torch.empty(n)
    settled = torch.zeros(n, dtype=torch.bool)
    while True:
        if line.dim() == 2:
            low, high = line.amin(-1), line.amax(-1)
            if bool(torch.isinf(low).any()):  # -inf (no mass) ties with the lowest floats: no overflow below
                line = line.clamp(min=-bound)
                low = low.clamp(min=-bound)
        else:
            low = torch.full((n,), math.inf).scatter_reduce(0, owner, line, "amin")
            high = torch.full((n,), -math.inf).scatter_reduce(0, owner, line, "amax")
        done = ~settled & (high <= low)  # one value left in the row: the answer
        answer = torch.where(done, high, answer)
        settled |= done
        if bool(settled.all()):  # host decisions: free on a CPU
            return answer
        scale = parts / (high - low)  # [n]; inf or nan only where a row is settled, or its range subnormal
        tiny = ~settled & ~torch.isfinite(scale)
        scale = scale.nan_to_num(0.0, posinf=bound, neginf=0.0)
        part = line.sub(low[owner]).mul_(scale[owner]).floor_().clamp_(0, parts - 1)
        if bool(tiny.any()):  # the largest apart from the smallest, whatever the rounding
            part = torch.where(line == high[owner], parts - 1, part)
        index = part.int() + (owner * parts).int()  # [n, V] or [m]: row * parts + part
        flat = index.reshape(-1)
        mass = torch.bincount(flat, weights=weight.reshape(-1), minlength=n * parts).double().view(n, parts)
        count = torch.bincount(flat, minlength=n * parts).view(n, parts)
        beyond = mass.flip(1).cumsum(1).flip(1) - mass  # [n, parts]: mass of the parts above each
        # The lowest non-empty part whose better tokens weigh less than the target (the top non-empty one does).
        chosen = ((count > 0) & (above[:, None] + beyond < target[:, None])).int().argmax(1)  # [n]
        above = torch.where(settled, above, above + beyond.gather(1, chosen[:, None])[:, 0])
        keep = (index == (rows * parts + chosen).int()[owner]) & ~settled[owner]
        kept = keep.reshape(-1).nonzero().squeeze(1)  # once, for the three selections
        owner = kept // vocab if line.dim() == 2 else owner[kept]
        line, weight = line.reshape(-1)[kept], weight.reshape(-1)[kept]


def searched_nucleus_thresholds(
    logits: Tensor, normaliser: Tensor, top_p: Tensor, *, stop_early: bool | None = None
) -> Tensor:
    """The threshold search on every row, one pivot a pass (32 passes): [N, V] logits, [N, 1] their logsumexp,
    [N] top_p -> [N, 1]. (Where decoding takes the Triton kernels, sampling runs its own search, 16 pivots a pass:
    `txl.kernels.triton.sampling`.)"""
    keys = float_keys(logits)  # [N, V]
    probs = torch.exp(logits - normaliser)  # [N, V]
    zero = torch.zeros((), device=logits.device)

    def masses(pivots: Tensor) -> Tensor:  # [N, 1] -> [N, 1]
        return torch.where(keys > pivots.to(torch.int32), probs, zero).sum(-1, keepdim=True)

    largest = float_keys(logits.amax(-1))  # [N]: nothing lies above it
    found = threshold_search(masses, largest, top_p, ways=1, stop_early=stop_early)
    return key_to_float(found)[:, None]


def threshold_search(
    masses_above: Callable[[Tensor], Tensor],
    largest: Tensor,
    target: Tensor,
    *,
    ways: int,
    stop_early: bool | None = None,
) -> Tensor:
    """Per row, the smallest key t whose mass above it, `masses_above(pivots [N, ways]) -> [N, ways]`, is below
    `target` [N]; `largest` [N] is each row's largest key. The answer is a key some token holds (the mass above
    only changes at one), or the key of -inf where the whole row weighs less than the target (all are kept).

    An interval (lo, hi] holds the answer: mass above hi < target (hi starts at the largest key) and mass above
    lo >= target (lo starts below every float). Each pass weighs `ways` pivots that cut it into ways + 1 parts
    and keeps the part where the mass crosses the target. Keys span at most 2**32 values, so a fixed number of
    passes, `search_passes(ways)` (32 for one pivot a pass, 8 for 16), leaves one: on a GPU the loop is not
    decided by the host (no synchronisation; a CUDA graph captures it). Where `stop_early` (default: on a CPU)
    the loop ends as soon as every row's interval is down to one key."""
    device = largest.device
    hi = largest.long()
    lo = torch.full_like(hi, NEG_INF_KEY - 1)
    cuts = torch.arange(1, ways + 1, device=device)  # [J]
    if stop_early is None:
        stop_early = device.type == "cpu"
    for _ in range(search_passes(ways)):
        active = hi - lo > 1
        if stop_early and not bool(active.any()):
            break
        pivots = lo[:, None] + (hi - lo)[:, None] * cuts // (ways + 1)  # [N, J] increasing, in [lo, hi)
        # The mass above a pivot falls as the pivot rises: `below` reads False.. then True.. along a row.
        below = masses_above(pivots) < target[:, None]  # [N, J]
        count = below.sum(-1)  # [N]
        first = ways - count  # the first pivot whose mass above is below the target (ways: none)
        hi = torch.where(active & (count > 0), pivots.gather(1, first.clamp(max=ways - 1)[:, None])[:, 0], hi)
        lo = torch.where(active & (first > 0), pivots.gather(1, (first - 1).clamp(min=0)[:, None])[:, 0], lo)
    # Where the whole row weighs less than the target, the search ends at lo's start: every token is kept.
    return hi.clamp(min=NEG_INF_KEY)


@functools.cache
def search_passes(ways: int) -> int:
    """Passes that leave one key of 2**32 when each keeps at most the largest of ways + 1 parts."""
    width, passes = 1 << 32, 0
    while width > 1:
        width, passes = -(-width // (ways + 1)), passes + 1
    return passes


# Keys: the sign-magnitude bits of a float32 as an int32, negatives' magnitude flipped, so that they order as the
# floats do. The Triton kernel computes the same keys (kernels/triton/sampling.py).
_MAGNITUDE = 0x7FFFFFFF
NEG_INF_KEY = -1 - 0x7F800000  # the key of -inf, below every other float's


def float_keys(x: Tensor) -> Tensor:
    """[..] float32 -> [..] int32 keys ordered as the floats are (-0.0 taken as 0.0, so that they tie)."""
    bits = (x.float() + 0.0).view(torch.int32)
    return torch.where(bits < 0, bits ^ _MAGNITUDE, bits)


def key_to_float(key: Tensor) -> Tensor:
    bits = key.to(torch.int32)
    return torch.where(bits < 0, bits ^ _MAGNITUDE, bits).view(torch.float32)
