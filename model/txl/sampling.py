"""Choosing the next token from log-probabilities: greedy, temperature, top-k, top-p; seeded per request.

Everything here is tensor arithmetic that runs where the log-probabilities are (a GPU never sends the
distribution to the host): each row carries its own parameters, and its randomness is a counter-based hash of
(the request's seed, the token's index in the request), not a generator's state. So a row's sample depends only
on its own distribution, seed and index: not on what else is in the batch, nor on how many steps ran before
it, and a fork given the same seed samples the same tokens.

Sampling is by inverse CDF in vocabulary order over the kept tokens: top-k and top-p decide which tokens are
kept (a threshold on the logits: a partial selection for top-k, and for top-p a partial selection on a CPU or a
threshold search, never a sort of the vocabulary), never the order in which they are searched. The draw is
always a kept token, even where the random number rounds to the top of the distribution.
The log-prob returned with a token is the model's own (before temperature and truncation), which scoring needs.

What a seed promises. The random number is exact integer arithmetic, the same on every device. The token drawn
from it is a function of the distribution as computed: on the same device, in the same dtype and through the same
batch path (eager or graph, the same kernels) a seeded request repeats exactly. Across devices, or in bfloat16,
the log-probabilities differ in their last bits, so the same numbers give the same tokens until the first
near-tie (a number that falls within that difference of a boundary between two tokens' shares, or a token at the
edge of top-p); from there the texts may diverge.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .kernels import triton_decode, triton_sampling


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 means no limit
    top_p: float = 1.0  # nucleus mass; 1 means no limit
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1


# ---------------------------------------------------------------------- counter-based random numbers

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # < 2**27, so a 32-bit value times it stays below 2**59: no int64 overflow anywhere


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash (values in [0, 2**32) held in int64)."""
    x = x ^ (x >> 16)
    x = (x * _MIX) & _MASK32
    x = x ^ (x >> 16)
    x = (x * _MIX) & _MASK32
    return x ^ (x >> 16)


def counter_uniform(seeds: Tensor, counters: Tensor) -> Tensor:
    """One number in [0, 1) per row, a pure function of (seed, counter): float64 with 53 random bits.

    seeds: int64 (any value; taken as 64 bits), counters: int64 >= 0 (< 2**32)."""
    lo = seeds & _MASK32
    hi = (seeds >> 32) & _MASK32
    h = _mix32(lo ^ _mix32(hi ^ _mix32((counters & _MASK32) ^ 0x9E3779B9)))
    a = _mix32(h ^ 0x85EBCA6B) >> 5  # 27 bits
    b = _mix32(h ^ 0xC2B2AE35) >> 6  # 26 bits
    return (a * 67108864 + b).double() / 9007199254740992.0  # (a * 2**26 + b) / 2**53


def seed_from(generator: torch.Generator) -> int:
    """A 63-bit seed drawn from a torch generator (for callers that hold one)."""
    return int(torch.randint(0, 2**62, (), generator=generator).item())


def make_generator(seed: int | None) -> torch.Generator:
    """A private random stream, seeded (or from fresh entropy)."""
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return generator


# ---------------------------------------------------------------------- per-row parameters as tensors


@dataclass(frozen=True)
class RowParams:
    """The sampling parameters of N rows as tensors on the rows' device, and what the host knows of them."""

    temperature: Tensor  # [N] float32; 1 for greedy rows (their temperature is unused)
    greedy: Tensor  # [N] bool
    top_k: Tensor  # [N] long; vocab size where unlimited
    top_p: Tensor  # [N] float32
    seeds: Tensor  # [N] int64
    counters: Tensor  # [N] int64: index of the token being sampled within its request
    max_top_k: int  # the largest limited top_k (0: no row limits k)
    any_top_p: bool

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        counters: Sequence[int],
        vocab: int,
        device: torch.device | str,
    ) -> RowParams:
        limited = [p.top_k for p in params if 0 < p.top_k < vocab]
        return cls(
            torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=device),
            torch.tensor([p.greedy for p in params], device=device),
            torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            torch.tensor([_signed64(s) for s in seeds], dtype=torch.int64, device=device),
            torch.tensor(list(counters), dtype=torch.int64, device=device),
            max(limited, default=0),
            any(p.top_p < 1 for p in params),
        )


def _signed64(seed: int) -> int:
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed


# ---------------------------------------------------------------------- sampling


# Top-p on a CPU: the best NUCLEUS_CANDIDATES words first (a partial selection: 4 ms for [64, 267,735]); rows
# whose nucleus they do not cover (a flat distribution) look at 8 times as many, while that stays a small part of
# the vocabulary (a quarter), and take the threshold search beyond.
NUCLEUS_CANDIDATES = 1024


def keep_thresholds(logits: Tensor, rows: RowParams) -> Tensor:
    """[N, V] logits (tempered) -> [N, 1]: the smallest logit each row keeps (-inf: all). Every token at or above
    it is kept, so tied tokens are kept or dropped together."""
    n, vocab = logits.shape
    threshold = torch.full((n, 1), -math.inf, device=logits.device)
    if rows.max_top_k:
        # A partial selection of the max_top_k best (not a sort of the vocabulary); the k-th best is the threshold.
        kth = torch.topk(logits, rows.max_top_k, dim=-1).values  # [N, kmax] best first
        k = rows.top_k.clamp(max=rows.max_top_k)[:, None] - 1
        limited = (rows.top_k < vocab)[:, None]
        threshold = torch.where(limited, kth.gather(1, k), threshold)
    if rows.any_top_p:
        threshold = torch.maximum(threshold, nucleus_thresholds(logits, rows.top_p))
    return threshold


def nucleus_thresholds(logits: Tensor, top_p: Tensor) -> Tensor:
    """[N, V] logits, [N] top_p -> [N, 1]: per row, the smallest logit v whose better tokens (logit > v) hold
    less than top_p of the mass. Keeping every token >= v keeps the smallest most-likely set whose mass reaches
    top_p (ties at its edge included, whatever order a sort would give them); the best token always stays.

    On a CPU the best candidates decide it for the rows whose nucleus they cover (the host checks, and widens);
    elsewhere, and for the other rows, the threshold search over the whole vocabulary, which never leaves the
    device. Both are exact, and neither sorts the vocabulary."""
    n, vocab = logits.shape
    normaliser = torch.logsumexp(logits, dim=-1, keepdim=True)  # [N, 1]
    if logits.device.type != "cpu":
        return searched_nucleus_thresholds(logits, normaliser, top_p)
    threshold = torch.full((n, 1), -math.inf)
    todo = torch.arange(n)  # rows not decided yet
    k = min(vocab, NUCLEUS_CANDIDATES)
    while True:
        values = torch.topk(logits.index_select(0, todo), k).values  # [n', k] best first
        probs = torch.exp(values - normaliser.index_select(0, todo))
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
        if k > max(vocab // 4, NUCLEUS_CANDIDATES):
            break
    threshold[todo] = searched_nucleus_thresholds(
        logits.index_select(0, todo), normaliser.index_select(0, todo), top_p.index_select(0, todo)
    )
    return threshold


def searched_nucleus_thresholds(
    logits: Tensor,
    normaliser: Tensor,
    top_p: Tensor,
    *,
    use_triton: bool | None = None,
    stop_early: bool | None = None,
) -> Tensor:
    """`nucleus_thresholds` by the threshold search, on every row: [N, V] logits, [N, 1] their logsumexp, [N]
    -> [N, 1]. The masses come from the Triton kernel (PIVOTS pivots a pass) where `use_triton` (default: on
    CUDA, where Triton kernels are available), else from torch (one pivot a pass)."""
    if use_triton is None:
        use_triton = logits.device.type == "cuda" and triton_decode.available(logits.device)
    masses: Callable[[Tensor], Tensor]
    if use_triton:
        ways = triton_sampling.PIVOTS
        masses = functools.partial(triton_sampling.masses_above, logits, normaliser)
    else:
        ways = 1
        keys = _float_keys(logits)  # [N, V]
        probs = torch.exp(logits - normaliser)  # [N, V]
        zero = torch.zeros((), device=logits.device)

        def masses(pivots: Tensor) -> Tensor:  # [N, 1] -> [N, 1]
            return torch.where(keys > pivots.to(torch.int32), probs, zero).sum(-1, keepdim=True)

    largest = _float_keys(logits.amax(-1))  # [N]: nothing lies above it
    found = threshold_search(masses, largest, top_p, ways=ways, stop_early=stop_early)
    return _key_to_float(found)[:, None]


def threshold_search(
    masses_above: Callable[[Tensor], Tensor],
    largest: Tensor,
    target: Tensor,
    *,
    ways: int,
    stop_early: bool | None = None,
) -> Tensor:
    """Per row, the smallest key t (a logit's float bits, ordered; see `_float_keys`) whose mass above it,
    `masses_above(pivots [N, ways]) -> [N, ways]`, is below `target` [N]; `largest` [N] is the largest key of
    each row. The answer is a key some token holds (the mass above only changes at one), or the key of -inf where
    even the whole row weighs less than the target (then every token is kept).

    An interval (lo, hi] holds the answer: mass above hi < target (hi starts at the largest key) and mass above
    lo >= target (lo starts below every float). Each pass weighs `ways` pivots that cut it into ways + 1 parts
    and keeps the part where the mass crosses the target. The keys span at most 2**32 values, so a fixed number
    of passes, `search_passes(ways)` (32 for one pivot a pass, 8 for 16), leaves one: on a GPU the loop is not
    decided by the host (no synchronisation; a CUDA graph captures it). Where `stop_early` (default: on a CPU)
    the loop ends as soon as every row's interval is down to one key."""
    device = largest.device
    hi = largest.long()
    lo = torch.full_like(hi, _NEG_INF_KEY - 1)
    cuts = torch.arange(1, ways + 1, device=device)  # [J]
    if stop_early is None:
        stop_early = device.type == "cpu"
    for _ in range(search_passes(ways)):
        active = hi - lo > 1
        if stop_early and not bool(active.any()):
            break
        pivots = lo[:, None] + (hi - lo)[:, None] * cuts // (ways + 1)  # [N, J] increasing, in (lo, hi]
        # The mass above a pivot falls as the pivot rises: `below` reads False.. then True.. along a row.
        below = masses_above(pivots) < target[:, None]  # [N, J]
        count = below.sum(-1)  # [N]
        first = ways - count  # the first pivot whose mass above is below the target (ways: none)
        hi = torch.where(active & (count > 0), pivots.gather(1, first.clamp(max=ways - 1)[:, None])[:, 0], hi)
        lo = torch.where(active & (first > 0), pivots.gather(1, (first - 1).clamp(min=0)[:, None])[:, 0], lo)
    # Where the whole row weighs less than the target, the search ends at lo's start: every token is kept.
    return hi.clamp(min=_NEG_INF_KEY)


@functools.cache
def search_passes(ways: int) -> int:
    """Passes that leave one key of 2**32 when each keeps at most the largest of ways + 1 parts."""
    width, passes = 1 << 32, 0
    while width > 1:
        width, passes = -(-width // (ways + 1)), passes + 1
    return passes


# Keys: float32 logits as int32 in the same order (the sign-magnitude bits, negatives' magnitude flipped).
_MAGNITUDE = 0x7FFFFFFF
_NEG_INF_KEY = -1 - 0x7F800000  # the key of -inf, below every other float's


def _float_keys(x: Tensor) -> Tensor:
    """[..] float32 -> [..] int32 keys ordered as the floats are (-0.0 taken as 0.0, so that they tie). The
    Triton kernel computes the same keys (kernels/triton_sampling.py)."""
    bits = (x.float() + 0.0).view(torch.int32)
    return torch.where(bits < 0, bits ^ _MAGNITUDE, bits)


def _key_to_float(key: Tensor) -> Tensor:
    bits = key.to(torch.int32)
    return torch.where(bits < 0, bits ^ _MAGNITUDE, bits).view(torch.float32)


def sample_rows(log_probs: Tensor, rows: RowParams) -> tuple[Tensor, Tensor]:
    """[N, V] float32 log-probs -> (token ids [N] long, the model's log-prob of each [N] float32), on the same
    device, with no host synchronisation (but for CPU top-p, where the host decides what to search)."""
    logits = log_probs / rows.temperature[:, None]
    threshold = keep_thresholds(logits, rows)
    weights = torch.exp(logits - logits.amax(-1, keepdim=True)).masked_fill(logits < threshold, 0)  # [N, V]
    cdf = weights.cumsum(-1)
    total = cdf[:, -1:].contiguous()  # [N, 1]
    target = counter_uniform(rows.seeds, rows.counters).to(cdf.dtype) * cdf[:, -1]  # [N]
    # The first token whose cdf exceeds the target: a token of zero weight never does. The target may round up to
    # the total (a number within 2**-25 of 1 becomes 1.0 in float32); the last token at which the cdf reaches the
    # total is then the one drawn, a kept token like every other the search can return.
    drawn = torch.searchsorted(cdf, target[:, None], right=True)
    last = torch.searchsorted(cdf, total)  # [N, 1]: the first index where the cdf equals the total
    drawn = torch.minimum(drawn, last).squeeze(1)
    tokens = torch.where(rows.greedy, log_probs.argmax(-1), drawn)
    return tokens, log_probs.gather(1, tokens[:, None]).squeeze(1)


def sample_batch(
    log_probs: Tensor, params: Sequence[SamplingParams], seeds: Sequence[int], counters: Sequence[int]
) -> tuple[list[int], list[float]]:
    """Host-side convenience: [N, V] log-probs -> per row (token id, the model's log-prob of it)."""
    rows = RowParams.build(params, seeds, counters, log_probs.size(1), log_probs.device)
    tokens, logprobs = sample_rows(log_probs.float(), rows)
    return tokens.tolist(), logprobs.tolist()


def sample(
    log_probs: Tensor, params: SamplingParams, generator: torch.Generator | None = None, *, counter: int = 0
) -> tuple[int, float]:
    """log_probs [V] -> (token id, the model's log-prob of it). The seed is drawn from `generator` when one is
    given (a fresh draw each call: a stream of samples), else it is `params.seed`, else random."""
    if generator is not None:
        seed = seed_from(generator)
    else:
        seed = params.seed if params.seed is not None else seed_from(make_generator(None))
    (token,), (logprob,) = sample_batch(log_probs[None, :], [params], [seed], [counter])
    return token, logprob


def truncated_logits(log_probs: Tensor, params: SamplingParams) -> Tensor:
    """[V] log-probs -> [V] logits of the sampling distribution (temperature, then top-k and top-p: -inf for
    the tokens dropped)."""
    rows = RowParams.build([params], [0], [0], log_probs.numel(), log_probs.device)
    logits = log_probs.float()[None, :] / rows.temperature[:, None]
    return logits.masked_fill(logits < keep_thresholds(logits, rows), -math.inf)[0]
