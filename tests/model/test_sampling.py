"""Sampling helpers: greedy, temperature, top-k, top-p; a seed fixes the sample."""

from __future__ import annotations

import math

import pytest
import torch
from txl.sampling import SamplingParams, make_generator, sample, truncated_logits


def _log_probs(*probs: float) -> torch.Tensor:
    return torch.tensor(probs).log()


def test_greedy_takes_the_most_likely_token_and_reports_its_log_prob():
    token, logprob = sample(_log_probs(0.1, 0.6, 0.3), SamplingParams(temperature=0), make_generator(0))
    assert token == 1 and logprob == pytest.approx(math.log(0.6))


def test_top_k_keeps_only_the_k_best():
    logits = truncated_logits(_log_probs(0.1, 0.5, 0.3, 0.1), SamplingParams(top_k=2))
    assert torch.isinf(logits[[0, 3]]).all() and torch.isfinite(logits[[1, 2]]).all()


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    params = SamplingParams(top_p=0.7)
    logits = truncated_logits(_log_probs(0.05, 0.5, 0.3, 0.15), params)
    assert torch.isfinite(logits[[1, 2]]).all() and torch.isinf(logits[[0, 3]]).all()
    # The most likely token survives even a tiny top_p.
    logits = truncated_logits(_log_probs(0.2, 0.5, 0.3), SamplingParams(top_p=0.01))
    assert torch.isfinite(logits).tolist() == [False, True, False]


def test_samples_follow_the_distribution_and_a_seed_repeats_them():
    log_probs = _log_probs(0.2, 0.5, 0.3)
    params = SamplingParams(temperature=1.0, seed=11)
    draws = [sample(log_probs, params, make_generator(11))[0] for _ in range(3)]
    assert len(set(draws)) == 1
    generator = make_generator(3)
    counts = torch.bincount(
        torch.tensor([sample(log_probs, params, generator)[0] for _ in range(3000)]), minlength=3
    )
    assert torch.allclose(counts / 3000, torch.tensor([0.2, 0.5, 0.3]), atol=0.04)


def test_low_temperature_sharpens():
    generator = make_generator(0)
    draws = [sample(_log_probs(0.4, 0.6), SamplingParams(temperature=0.05), generator)[0] for _ in range(200)]
    assert sum(draws) >= 195


@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=-1), dict(temperature=math.nan), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2)],
)
def test_invalid_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
