"""Sampling helpers: greedy, temperature, top-k, top-p; a seed fixes the sample."""

from __future__ import annotations

import math

import pytest
import torch
from txl.sampling import (
    SamplingParams,
    counter_uniform,
    make_generator,
    sample,
    sample_batch,
    truncated_logits,
)


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


def test_a_rows_sample_does_not_depend_on_the_other_rows():
    log_probs = torch.log_softmax(torch.randn(5, 300, generator=torch.Generator().manual_seed(0)), dim=-1)
    params = [
        SamplingParams(temperature=0.7, seed=1),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.2, top_k=5, seed=2),
        SamplingParams(top_p=0.5, seed=3),
        SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=4),
    ]
    seeds, counters = [1, 0, 2, 3, 4], [7, 0, 3, 0, 12]
    batch, _ = sample_batch(log_probs, params, seeds, counters)
    alone = [
        sample_batch(log_probs[i : i + 1], [p], [seeds[i]], [counters[i]])[0][0] for i, p in enumerate(params)
    ]
    assert batch == alone
    # In another order, beside other rows, the same rows draw the same tokens.
    order = [3, 0, 4, 1, 2]
    shuffled, _ = sample_batch(
        log_probs[order], [params[i] for i in order], [seeds[i] for i in order], [counters[i] for i in order]
    )
    assert shuffled == [batch[i] for i in order]


def test_the_random_number_is_a_pure_function_of_seed_and_counter():
    seeds = torch.tensor([0, 1, -5, 2**62 + 3, 1])
    counters = torch.tensor([0, 0, 9, 4, 1])
    u = counter_uniform(seeds, counters)
    assert ((u >= 0) & (u < 1)).all() and len(set(u.tolist())) == 5
    torch.testing.assert_close(counter_uniform(seeds, counters), u, rtol=0, atol=0)
    # Uniform enough to sample with: 20,000 counters of one seed fill ten bins evenly.
    many = counter_uniform(torch.full((20000,), 42), torch.arange(20000))
    counts = torch.histc(many.float(), bins=10, min=0, max=1)
    assert (counts - 2000).abs().max() < 200


def test_top_k_and_top_p_together_keep_the_intersection():
    params = SamplingParams(top_k=3, top_p=0.6)
    logits = truncated_logits(_log_probs(0.05, 0.4, 0.3, 0.15, 0.1), params)
    assert torch.isfinite(logits).tolist() == [False, True, True, False, False]


def test_greedy_rows_in_a_batch_take_the_argmax_whatever_their_seed():
    log_probs = torch.log_softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(3)), dim=-1)
    tokens, logprobs = sample_batch(
        log_probs, [SamplingParams(temperature=0)] * 4, [1, 2, 3, 4], [0, 5, 9, 2]
    )
    assert tokens == log_probs.argmax(-1).tolist()
    assert logprobs == pytest.approx(log_probs.max(-1).values.tolist())


def test_top_p_on_a_large_flat_vocabulary_matches_a_full_sort():
    # Nearly flat over 300,000 words: the nucleus is wider than the first 1,024 candidates.
    logits = torch.randn(300_000, generator=torch.Generator().manual_seed(1)) * 0.1
    log_probs = torch.log_softmax(logits, dim=0)
    kept = torch.isfinite(truncated_logits(log_probs, SamplingParams(top_p=0.3)))
    order = torch.sort(log_probs, descending=True).indices
    mass = log_probs.exp()[order].cumsum(0)
    expected = int((mass - log_probs.exp()[order] < 0.3).sum())
    assert int(kept.sum()) == expected
    assert kept[order[:expected]].all()


def test_masked_tokens_are_never_sampled():
    log_probs = torch.log(torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0]))
    generator = make_generator(9)
    draws = {sample(log_probs, SamplingParams(temperature=1.0), generator)[0] for _ in range(500)}
    assert draws == {1, 3}
