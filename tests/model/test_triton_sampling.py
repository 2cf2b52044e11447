"""Top-p's threshold search with the Triton kernel's masses (what a GPU runs): exact, under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
from txl import nucleus
from txl.kernels import triton_decode, triton_sampling

from .test_sampling import _rows_of_every_kind, _sorted_thresholds
from .test_triton_decode import _interpreted

needs_triton = pytest.mark.skipif(triton_decode.triton is None, reason="triton is not installed")


@needs_triton
def test_the_search_with_triton_masses_keeps_what_a_full_sort_keeps():
    """Peaked, flat, tied, uniform rows and rows with -inf words, top_p 0.05, 0.9, 0.999: the 8-pass search
    over 16 pivots finds the same thresholds as torch's 32-pass search and as a full sort."""
    result = _interpreted("sampling")
    thresholds = result["thresholds"]
    assert thresholds["triton"] == thresholds["sorted"]
    assert thresholds["torch"] == thresholds["sorted"]
    assert result["mass_error"] < 1e-5


def test_passes_leave_one_key_of_two_to_the_32():
    assert nucleus.search_passes(1) == 32
    assert nucleus.search_passes(triton_sampling.PIVOTS) == 8


@needs_triton
def test_the_masses_kernel_does_not_specialise_on_the_vocabulary_or_the_split():
    names = {p.name for p in triton_sampling.jit_kernel().params if p.do_not_specialize}
    assert names == {"V", "row_stride", "parts"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_search_on_cuda_keeps_what_a_full_sort_keeps():
    log_probs = _rows_of_every_kind(300_000, torch.Generator().manual_seed(4)).cuda()
    normaliser = torch.logsumexp(log_probs, -1, keepdim=True)
    for top_p in (0.05, 0.9, 0.999):
        limit = torch.full((len(log_probs),), top_p, device="cuda")
        found = nucleus.searched_nucleus_thresholds(log_probs, normaliser, limit)
        assert found[:, 0].tolist() == [_sorted_thresholds(row, 0, top_p) for row in log_probs.cpu()]
