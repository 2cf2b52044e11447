"""The paths a GPU takes so that no step waits for the host compute what the plain paths compute."""

from __future__ import annotations

import torch

from tests.helpers.tiny_models import tiny_model


def test_masked_adaptive_embedding_equals_the_per_cluster_one():
    model = tiny_model(seed=31, cutoffs=[17, 45], div_val=2)
    embedding = model.transformer.word_emb
    tokens = torch.randint(0, 64, (50,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(
            embedding._masked(tokens), embedding._by_cluster(tokens), rtol=0, atol=1e-6
        )


def test_target_log_probs_with_host_targets_equal_the_device_search():
    model = tiny_model(seed=32, cutoffs=[17, 45], div_val=2)
    hidden = torch.randn(40, model.config.d_model, generator=torch.Generator().manual_seed(2))
    targets = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = model.log_probs(hidden).gather(1, targets[:, None])[:, 0]
        torch.testing.assert_close(model.target_log_probs(hidden, targets), expected)
        torch.testing.assert_close(model.target_log_probs(hidden, targets, targets.tolist()), expected)
