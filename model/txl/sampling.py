"""Choosing the next token from log-probabilities: greedy, temperature, top-k, top-p; seeded per request.

Pure functions over one row of log-probabilities, kept outside the model (the model only scores). The log-prob
returned with a token is the model's own (before temperature and truncation), which is what scoring needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


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


def make_generator(seed: int | None) -> torch.Generator:
    """A private random stream: a request's samples do not depend on what else runs beside it."""
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return generator


def truncated_logits(log_probs: Tensor, params: SamplingParams) -> Tensor:
    """[V] log-probs -> [V] logits of the sampling distribution (temperature, then top-k, then top-p)."""
    return truncated_logits_batch(log_probs[None, :], [params])[0]


def truncated_logits_batch(log_probs: Tensor, params: Sequence[SamplingParams]) -> Tensor:
    """[N, V] log-probs -> [N, V] logits to sample from, each row with its own parameters (not greedy)."""
    logits = log_probs.float() / torch.tensor([[p.temperature] for p in params])  # [N, V]
    vocab = logits.size(1)
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    if min(top_k) < vocab:
        kth = torch.topk(logits, max(k for k in top_k if k < vocab), dim=-1).values  # [N, kmax] best first
        limits = kth.gather(1, torch.tensor([[min(k, kth.size(1)) - 1] for k in top_k]))  # [N, 1]
        limits[torch.tensor(top_k) >= vocab] = -math.inf
        logits = logits.masked_fill(logits < limits, -math.inf)
    for row, p in enumerate(params):
        if p.top_p < 1.0:
            logits[row] = _nucleus(logits[row], p.top_p)
    return logits


def _nucleus(logits: Tensor, top_p: float) -> Tensor:
    """Keeps the smallest set of most likely tokens whose mass reaches top_p (the best token always stays).

    Looks at the best 1,024 tokens first, widening only if they hold less than top_p: sorting a whole
    267,735-word distribution for every token would cost more than the model step.
    """
    vocab = logits.numel()
    normaliser = torch.logsumexp(logits, dim=0)
    k = min(vocab, 1024)
    while True:
        values, order = torch.topk(logits, k)  # best first
        probs = torch.exp(values - normaliser)
        mass_before = probs.cumsum(0) - probs
        if float(mass_before[-1] + probs[-1]) >= top_p or k == vocab:
            break
        k = min(vocab, k * 8)
    drop = mass_before >= top_p
    drop[0] = False
    kept = torch.full_like(logits, -math.inf)
    keep = order[~drop]
    kept[keep] = logits[keep]
    return kept


def sample(log_probs: Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """log_probs [V] (float32, on CPU) -> (token id, the model's log-prob of it)."""
    (token,), (logprob,) = sample_batch(log_probs[None, :], [params], [generator])
    return token, logprob


def sample_batch(
    log_probs: Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> tuple[list[int], list[float]]:
    """[N, V] log-probs -> per row (token id, the model's log-prob of it), each row with its own parameters and
    random stream: a row's sample does not depend on the other rows.

    Sampling is by inverse CDF: one uniform number per row from that row's generator, located in the row's
    cumulative distribution (one vectorised search for every row instead of a multinomial per row).
    """
    tokens = torch.empty(len(params), dtype=torch.long)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if greedy:
        tokens[greedy] = torch.argmax(log_probs[greedy], dim=-1)
    if sampled:
        probs = torch.softmax(
            truncated_logits_batch(log_probs[sampled], [params[i] for i in sampled]), dim=-1
        )
        cdf = probs.cumsum(dim=-1)  # [n, V]
        u = torch.cat([torch.rand(1, generator=generators[i], dtype=torch.float64) for i in sampled]).float()
        # The first token whose cdf exceeds u: a token of zero probability never does.
        tokens[sampled] = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
    logprobs = log_probs.gather(1, tokens[:, None]).squeeze(1)
    return tokens.tolist(), logprobs.tolist()
