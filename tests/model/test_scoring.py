"""Scoring: target-only log-probs equal the full distribution's; documents score in constant memory."""

from __future__ import annotations

import math

import torch
from txl.scoring import score_tokens

from tests.helpers.tiny_models import tiny_model


def test_target_log_probs_equal_the_full_distribution():
    for overrides in ({}, {"cutoffs": [], "div_val": 1}, {"div_val": 1, "d_embed": 12}):
        model = tiny_model(seed=6, **overrides)
        hidden = torch.randn(50, model.config.d_model)
        targets = torch.randint(0, 64, (50,))
        full = model.log_probs(hidden)
        torch.testing.assert_close(full.exp().sum(-1), torch.ones(50), rtol=0, atol=1e-5)
        torch.testing.assert_close(
            model.target_log_probs(hidden, targets), full.gather(1, targets[:, None])[:, 0]
        )


def test_scoring_in_segments_equals_one_pass_and_reports_progress():
    model = tiny_model(seed=7, mem_len=64)
    tokens = torch.randint(0, 64, (60,), generator=torch.Generator().manual_seed(2)).tolist()
    seen = []
    segmented = score_tokens(
        model, tokens, segment_len=7, token_logprobs=True, progress=lambda d, t: seen.append(d)
    )
    whole = score_tokens(model, tokens, segment_len=60, token_logprobs=True)
    assert segmented.scored == whole.scored == 59
    assert math.isnan(segmented.token_logprobs[0])
    torch.testing.assert_close(
        torch.tensor(segmented.token_logprobs[1:]), torch.tensor(whole.token_logprobs[1:])
    )
    assert seen == [7, 14, 21, 28, 35, 42, 49, 56, 60]


def test_long_documents_score_in_constant_memory():
    model = tiny_model(seed=8, mem_len=16)
    tokens = torch.randint(0, 64, (16 * 12,), generator=torch.Generator().manual_seed(4)).tolist()
    sizes = []
    score_tokens(model, tokens[:32], segment_len=8)
    for n in (32, 96, 192):
        result = score_tokens(model, tokens[:n], segment_len=8)
        sizes.append((result.memory.length, result.memory.allocated_nbytes))
    assert len(set(sizes)) == 1 and sizes[0][0] == 16
