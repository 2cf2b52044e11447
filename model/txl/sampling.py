"""Choosing the next token from log-probabilities: greedy, temperature, top-k, top-p; seeded per request.

Everything here is tensor arithmetic that runs where the log-probabilities are (a GPU never sends the
distribution to the host): each row carries its own parameters, and its randomness is a counter-based hash of
(the request's seed, the token's index in the request), not a generator's state. So a row's sample depends only
on its own distribution, seed and index: not on what else is in the batch, nor on how many steps ran before
it, and a fork given the same seed samples the same tokens.

Sampling is by inverse CDF in vocabulary order over the kept tokens: top-k and top-p decide which tokens are
kept (a threshold on the logits: a partial selection for top-k, and for top-p a partial selection or a threshold
search, `txl.nucleus`; never a sort of the vocabulary), never the order in which they are searched. The draw is
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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .kernels import REFERENCE, DecodePath
from .kernels.triton import sampling as triton_sampling
from .nucleus import nucleus_thresholds


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


def _mix32_int(x: int) -> int:
    """`_mix32` on one Python integer: the same integer arithmetic, so the same bits."""
    x ^= x >> 16
    x = (x * _MIX) & _MASK32
    x ^= x >> 16
    x = (x * _MIX) & _MASK32
    return x ^ (x >> 16)


def counter_uniform_host(seeds: Sequence[int], counters: Sequence[int]) -> list[float]:
    """`counter_uniform` computed by the host in Python integers, bit for bit the same numbers: for a few rows on a
    CPU, this takes a fraction of the time the hash's few dozen small tensor operations do
    (docs/benchmarks/engine-figures.md). seeds: int64 values (`signed64`), counters: >= 0."""
    out = []
    for seed, counter in zip(seeds, counters, strict=True):
        lo, hi = (
            seed & _MASK32,
            (seed >> 32) & _MASK32,
        )  # Python's >> and & act on two's complement, as int64's
        h = _mix32_int(lo ^ _mix32_int(hi ^ _mix32_int((counter & _MASK32) ^ 0x9E3779B9)))
        a = _mix32_int(h ^ 0x85EBCA6B) >> 5
        b = _mix32_int(h ^ 0xC2B2AE35) >> 6
        out.append((a * 67108864 + b) / 9007199254740992.0)  # exact: below 2**53, over a power of two
    return out


def seed_from(generator: torch.Generator) -> int:
    """A 63-bit seed drawn from a torch generator (for callers that hold one)."""
    return int(torch.randint(0, 2**62, (), generator=generator).item())


def make_generator(seed: int | None) -> torch.Generator:
    """A private random stream, seeded (or from fresh entropy)."""
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return generator


# ---------------------------------------------------------------------- per-row parameters as numbers


@dataclass(frozen=True)
class RowValues:
    """The sampling parameters of N rows as the numbers the sampler reads, on the host: the one place parameters
    become per-row values. `RowParams.build` makes tensors of them; a decoding graph writes them into the static
    buffers it reads (engine.graphs), in place."""

    temperature: list[float]  # 1 for greedy rows (their temperature is unused)
    greedy: list[bool]
    top_k: list[int]  # the vocabulary size where unlimited
    top_p: list[float]
    seeds: list[int]  # int64 values (`signed64`)
    max_top_k: int  # the largest limited top_k (0: no row limits k)
    any_top_p: bool

    @classmethod
    def encode(cls, params: Sequence[SamplingParams], seeds: Sequence[int], vocab: int) -> RowValues:
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        return cls(
            # A positive temperature or top_p below float32's smallest normal number would round to 0 (or lose
            # its precision) in the sampler's float32: it samples as that smallest number instead, which keeps
            # the same tokens (only the best, but for exact ties).
            [1.0 if p.greedy else max(p.temperature, FLOAT32_TINY) for p in params],
            [p.greedy for p in params],
            top_k,
            [max(p.top_p, FLOAT32_TINY) for p in params],
            [signed64(s) for s in seeds],
            max((k for k in top_k if k < vocab), default=0),
            any(p.top_p < 1 for p in params),
        )


FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)

# A row that fills a batch out to its graph's size: greedy, unlimited, seed 0.
PADDING = SamplingParams(temperature=0.0)


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
    # counter_uniform(seeds, counters) [N] float64, where the host computed it (`build` on a CPU); None: computed
    # from the tensors where they are (a captured graph computes it from each replay's buffers).
    uniform: Tensor | None = None

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        counters: Sequence[int],
        vocab: int,
        device: torch.device | str,
    ) -> RowParams:
        values = RowValues.encode(params, seeds, vocab)
        uniform = None
        if torch.device(device).type == "cpu":
            uniform = torch.tensor(counter_uniform_host(values.seeds, counters), dtype=torch.float64)
        return cls(
            torch.tensor(values.temperature, device=device),
            torch.tensor(values.greedy, device=device),
            torch.tensor(values.top_k, device=device),
            torch.tensor(values.top_p, dtype=torch.float32, device=device),
            torch.tensor(values.seeds, dtype=torch.int64, device=device),
            torch.tensor(list(counters), dtype=torch.int64, device=device),
            values.max_top_k,
            values.any_top_p,
            uniform,
        )


def signed64(seed: int) -> int:
    """A seed of any size as the int64 the counter hash reads (its low 64 bits, two's complement)."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed


# ---------------------------------------------------------------------- sampling


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


def sample_rows(
    log_probs: Tensor, rows: RowParams, readback: Tensor | None = None, *, path: DecodePath = REFERENCE
) -> tuple[Tensor, Tensor]:
    """[N, V] float32 log-probs -> (token ids [N] long, the model's log-prob of each [N] float32), on the same
    device, with no host synchronisation (but for CPU top-p, where the host decides what to search). `readback`
    [N, 2] float64: each row's token and log-prob are also written there (what a decoding graph copies to the
    host). Where `path` names Triton's sampler, in a fixed few launches (`txl.kernels.triton.sampling`)."""
    if path.sampler == "triton":  # the counter hash too, inside the kernel
        return triton_sampling.sample(
            log_probs,
            rows.temperature,
            rows.greedy,
            rows.top_k,
            rows.top_p,
            rows.uniform,
            rows.seeds,
            rows.counters,
            max_top_k=rows.max_top_k,
            any_top_p=rows.any_top_p,
            readback=readback,
        )
    uniform = rows.uniform if rows.uniform is not None else counter_uniform(rows.seeds, rows.counters)
    tokens, logprobs = _sample_rows(log_probs, rows, uniform)
    if readback is not None:
        readback[:, 0] = tokens
        readback[:, 1] = logprobs
    return tokens, logprobs


def _sample_rows(log_probs: Tensor, rows: RowParams, uniform: Tensor) -> tuple[Tensor, Tensor]:
    # Each row's best token is brought to exactly 0 before tempering, so a positive temperature, however small,
    # leaves it at 0 (0 / t) and can only send the others to -inf: every row keeps a token of weight 1. Tempering
    # first let the best token underflow to -inf with the rest, and a row without a finite weight drew past the
    # vocabulary's end.
    logits = (log_probs - log_probs.amax(-1, keepdim=True)) / rows.temperature[:, None]  # [N, V], max 0
    weights = torch.exp(logits)  # [N, V]
    if rows.max_top_k or rows.any_top_p:  # else every token is kept: masking would change nothing
        weights = weights.masked_fill(logits < keep_thresholds(logits, rows), 0)
    cdf = weights.cumsum(-1)
    total = cdf[:, -1:].contiguous()  # [N, 1]
    target = uniform.to(cdf.dtype) * cdf[:, -1]  # [N]
    # The first token whose cdf exceeds the target: a token of zero weight never does. The target may round up to
    # the total (a number within 2**-25 of 1 becomes 1.0 in float32); the last token at which the cdf reaches the
    # total is then the one drawn, a kept token like every other the search can return.
    drawn = torch.searchsorted(cdf, target[:, None], right=True)
    last = torch.searchsorted(cdf, total)  # [N, 1]: the first index where the cdf equals the total
    # Never past the vocabulary's end, even for a row whose log-probs are not finite (NaN from the model): an id
    # out of range would fail the whole batch here (and poison a GPU's context in the embedding lookup). Such a
    # row's log-prob comes back NaN, which the host reads as that row's failure alone.
    drawn = torch.minimum(drawn, last).squeeze(1).clamp_(max=log_probs.size(1) - 1)
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
