"""Choosing the next token from log-probabilities: greedy, temperature, top-k, top-p; seeded per request.

Pure functions over one row of log-probabilities, kept outside the model (the model only scores). The log-prob
returned with a token is the model's own (before temperature and truncation), which is what scoring needs.
"""

from __future__ import annotations

import math
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
    logits = log_probs.float() / params.temperature
    if 0 < params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token once the mass before it already reaches top_p; the most likely token always stays.
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
        drop_sorted[0] = False
        logits = logits.masked_fill(drop_sorted.scatter(0, order, drop_sorted), -math.inf)
    return logits


def sample(log_probs: Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """log_probs [V] (float32, on CPU) -> (token id, the model's log-prob of it)."""
    if params.greedy:
        token = int(torch.argmax(log_probs).item())
    else:
        probs = torch.softmax(truncated_logits(log_probs, params), dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator).item())
    return token, float(log_probs[token].item())
