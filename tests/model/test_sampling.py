"""Sampling helpers: greedy, temperature, top-k, top-p; a seed fixes the sample."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from txl import nucleus
from txl.sampling import (
    RowParams,
    SamplingParams,
    counter_uniform,
    counter_uniform_host,
    keep_thresholds,
    make_generator,
    sample,
    sample_batch,
    sample_rows,
    signed64,
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


def test_the_hosts_random_numbers_are_the_devices_bit_for_bit():
    """A CPU's rows take their numbers from the host (Python integers), a graph's from its buffers (tensors):
    the same bits, so eager and graph steps draw the same tokens."""
    generator = torch.Generator().manual_seed(5)
    seeds = [signed64(s) for s in (0, 1, -1, -5, 2**63 - 1, -(2**63), 2**64 + 7, 3**40)]
    seeds += torch.randint(-(2**63), 2**63 - 1, (500,), generator=generator).tolist()
    counters = [0, 1, 2**32 - 1, 2**31, 9, 4, 1, 77]
    counters += torch.randint(0, 2**32, (500,), generator=generator).tolist()
    device = counter_uniform(torch.tensor(seeds), torch.tensor(counters))
    host = torch.tensor(counter_uniform_host(seeds, counters), dtype=torch.float64)
    assert torch.equal(host, device)
    # And a CPU's RowParams carries them: sampling with them or from the tensors draws the same tokens.
    log_probs = torch.log_softmax(torch.randn(len(seeds), 50, generator=generator), dim=-1)
    params = [
        SamplingParams(temperature=0.7 + (i % 5) / 10, top_p=1.0 if i % 3 else 0.9) for i in range(len(seeds))
    ]
    rows = RowParams.build(params, seeds, counters, 50, "cpu")
    assert rows.uniform is not None and torch.equal(rows.uniform, device)
    from_host = sample_rows(log_probs, rows)
    from_tensors = sample_rows(log_probs, dataclasses.replace(rows, uniform=None))
    assert torch.equal(from_host[0], from_tensors[0]) and torch.equal(from_host[1], from_tensors[1])


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


# ---------------------------------------------------------------------- the threshold search and the draw


def _sorted_thresholds(logits: torch.Tensor, top_k: int, top_p: float) -> float:
    """The definition, by a full sort (the oracle; the library never sorts the vocabulary): top-k keeps the k
    best, top-p the smallest most-likely set reaching top_p; every token tied with the last kept one stays."""
    values = torch.sort(logits, descending=True).values
    threshold = -math.inf if top_k == 0 else float(values[top_k - 1])
    if top_p < 1:
        probs = torch.exp(values - torch.logsumexp(logits, 0))
        kept = max(1, int(((probs.cumsum(0) - probs) < top_p).sum()))
        threshold = max(threshold, float(values[kept - 1]))
    return threshold


def _rows_of_every_kind(vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Peaked, flat (a nucleus wider than the CPU's candidates), heavily tied, uniform, and with -inf entries."""
    peaked = torch.randn(vocab, generator=generator) * 4
    flat = torch.randn(vocab, generator=generator) * 0.01
    tied = torch.randint(0, 6, (vocab,), generator=generator).float()
    uniform = torch.zeros(vocab)
    holes = torch.randn(vocab, generator=generator) * 2
    holes[torch.randperm(vocab, generator=generator)[: vocab // 3]] = -math.inf
    return torch.log_softmax(torch.stack([peaked, flat, tied, uniform, holes]), dim=-1)


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_keeps_what_a_full_sort_keeps_on_every_kind_of_distribution(top_p):
    log_probs = _rows_of_every_kind(3000, torch.Generator().manual_seed(int(top_p * 1000)))
    for temperature in (1.0, 0.7):
        params = [SamplingParams(temperature=temperature, top_p=top_p)] * len(log_probs)
        rows = RowParams.build(params, [0] * len(params), [0] * len(params), log_probs.size(1), "cpu")
        logits = log_probs / temperature
        got = keep_thresholds(logits, rows)[:, 0].tolist()
        assert got == [_sorted_thresholds(row, 0, top_p) for row in logits]
        # The search alone (what a GPU runs on every row), with the fixed number of steps and stopping early.
        normaliser = torch.logsumexp(logits, -1, keepdim=True)
        for stop_early in (False, True):
            searched = nucleus.searched_nucleus_thresholds(
                logits, normaliser, rows.top_p, stop_early=stop_early
            )
            assert searched[:, 0].tolist() == got


@pytest.mark.parametrize("top_p", [0.05, 0.9, 0.999])
def test_the_cpu_search_keeps_what_a_full_sort_keeps(monkeypatch, top_p):
    """With 16 candidates, every row but the most peaked goes on to the CPU's narrowing search."""
    monkeypatch.setattr(nucleus, "NUCLEUS_CANDIDATES", 16)
    log_probs = _rows_of_every_kind(3000, torch.Generator().manual_seed(int(top_p * 100)))
    got = nucleus.nucleus_thresholds(log_probs, torch.full((len(log_probs),), top_p))[:, 0].tolist()
    assert got == [_sorted_thresholds(row, 0, top_p) for row in log_probs]


def test_ties_at_the_edge_of_the_nucleus_are_kept_together():
    # Sorted: 0.4, then three tokens of 0.2. The nucleus reaches 0.5 at the second token; its two ties stay too.
    logits = truncated_logits(_log_probs(0.2, 0.4, 0.2, 0.2), SamplingParams(top_p=0.5))
    assert torch.isfinite(logits).all()
    # Top-k likewise keeps every token tied with the k-th best.
    logits = truncated_logits(_log_probs(0.2, 0.4, 0.2, 0.1, 0.1), SamplingParams(top_k=2))
    assert torch.isfinite(logits).tolist() == [True, True, True, False, False]


def test_a_draw_never_leaves_the_kept_set_when_the_number_rounds_to_one():
    """Issue 19, finding 7: the uniform number of (seed 12345, counter 44,620,616) is within 2**-25 of 1, so it
    is 1.0 in float32 and the target equals the total mass; the search found no token and the clamp returned the
    last vocabulary id (255), outside top-k. The draw is now the last kept token in vocabulary order."""
    seed, counter = 12345, 44_620_616
    assert float(counter_uniform(torch.tensor([seed]), torch.tensor([counter])).float()) == 1.0
    vocab = 256
    log_probs = torch.log_softmax(torch.randn(1, vocab, generator=torch.Generator().manual_seed(0)) * 3, -1)
    best = torch.topk(log_probs[0], 5).indices.tolist()
    for params in (SamplingParams(top_k=5), SamplingParams(top_p=0.3), SamplingParams(top_k=5, top_p=0.9)):
        kept = torch.isfinite(truncated_logits(log_probs[0], params)).nonzero().flatten().tolist()
        (token,), _ = sample_batch(log_probs, [params], [seed], [counter])
        assert token in kept and token == kept[-1]
        if params.top_k:
            assert token in best


def test_seeded_draws_are_those_of_the_sorted_inverse_cdf():
    """The same tokens as the full-sort implementation this one replaced, for the same seeds and counters: the
    kept set is the same, and the draw is the same inverse CDF in vocabulary order."""
    generator = torch.Generator().manual_seed(5)
    log_probs = torch.log_softmax(torch.randn(48, 2000, generator=generator) * 2.5, dim=-1)
    choices = [
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(top_k=40, seed=2),
        SamplingParams(temperature=1.3, top_p=0.9, seed=3),
        SamplingParams(top_k=200, top_p=0.6, seed=4),
        SamplingParams(temperature=2.0, top_p=0.99, seed=5),
    ]
    params = [choices[i % len(choices)] for i in range(len(log_probs))]
    seeds, counters = [p.seed or 0 for p in params], list(range(100, 100 + len(params)))
    tokens, _ = sample_batch(log_probs, params, seeds, counters)
    u = counter_uniform(torch.tensor(seeds), torch.tensor(counters)).float()
    expected = []
    for row, p, number in zip(log_probs, params, u, strict=True):
        logits = row / p.temperature
        weights = torch.exp(logits - logits.max())
        weights[logits < _sorted_thresholds(logits, p.top_k, p.top_p)] = 0
        cdf = weights.cumsum(0)
        expected.append(int(torch.searchsorted(cdf, number * cdf[-1], right=True)))
    assert tokens == expected


def test_sampling_on_a_device_reads_nothing_on_the_host():
    """Off the CPU, top-k, top-p and the draw run without a host decision: on the meta device, which holds no
    values, any read (`.item()`, `bool()`, `nonzero`) raises. A CUDA graph can capture what runs here."""
    n, vocab = 3, 5000
    rows = RowParams(
        torch.ones(n, device="meta"),
        torch.zeros(n, dtype=torch.bool, device="meta"),
        torch.full((n,), 40, dtype=torch.long, device="meta"),
        torch.full((n,), 0.9, device="meta"),
        torch.zeros(n, dtype=torch.int64, device="meta"),
        torch.zeros(n, dtype=torch.int64, device="meta"),
        40,
        True,
    )
    tokens, logprobs = sample_rows(torch.empty(n, vocab, device="meta"), rows)
    assert tokens.shape == (n,) and logprobs.shape == (n,)
