"""Sampling on the GPU (Triton), under Triton's interpreter: top-p's search keeps what a full sort keeps, and the
tokens drawn are the torch path's, with the number given by the host and with the counter hash computed in the
kernel."""

from __future__ import annotations

import json

import pytest
import torch
from txl import nucleus
from txl.kernels.triton import common as triton_common
from txl.kernels.triton import sampling as triton_sampling

from tests.helpers.interpreted import run_interpreted

from .test_triton_fused import interpreted

needs_triton = pytest.mark.skipif(triton_common.triton is None, reason="triton is not installed")


@needs_triton
def test_the_triton_sampler_keeps_what_a_full_sort_keeps_and_draws_the_torch_paths_tokens():
    """Peaked, flat, tied, uniform rows and rows with -inf words, at temperatures 1 and 0.7 and top_p 0.05, 0.9,
    0.999: the 8 passes over 16 pivots find a full sort's thresholds. Greedy, tempered, top-k, top-p and both
    rows' draws give the torch path's tokens (two seeds each, the number from the host and from the kernel's own
    hash), their log-probs land in the read-back buffer; a number that rounds to the whole kept weight draws the
    last kept token, as the torch path does, and a row of NaN log-probs gets an id in range."""
    result = interpreted("sampling")
    thresholds = result["thresholds"]
    assert thresholds["triton"] == thresholds["sorted"]
    assert result["compared"] == 50 and result["differ"] == 0 and result["hashed_differ"] == 0
    assert result["edge_tokens"][0] == result["torch_edge_tokens"][0] == 2
    assert (
        0 <= result["edge_tokens"][1] < 4 and result["edge_logprobs"][1] is None
    )  # NaN: that row fails alone


@needs_triton
def test_top_ps_last_program_reads_the_chunks_figures_together():
    """Review round 3, finding 2: the last program of each pass summed its row's chunk masses one chunk after
    another (50 loads at 40 chunks; a wt103 row's 66, about 40-60 us a step on an H200); it reads them
    CHUNK_BLOCK chunks at a time, as `draw` does: 11 loads, the same whatever the chunks up to 128."""
    done = run_interpreted("tests.model.loads_interpreted", "nucleus", timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["passes"]) == triton_sampling.PASSES
    assert max(p["most"] for p in result["passes"]) <= 12, result


def test_passes_leave_one_key_of_two_to_the_32():
    assert nucleus.search_passes(1) == 32
    assert nucleus.search_passes(triton_sampling.PIVOTS) == triton_sampling.PASSES == 8


@needs_triton
def test_the_sampling_kernels_do_not_specialise_on_the_vocabulary_or_the_split():
    for kernel in triton_sampling.jit_kernels():
        assert {"V", "chunks"} <= {p.name for p in kernel.params if p.do_not_specialize}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_search_on_cuda_keeps_what_a_full_sort_keeps():
    from .test_sampling import _rows_of_every_kind, _sorted_thresholds

    log_probs = _rows_of_every_kind(300_000, torch.Generator().manual_seed(4)).cuda()
    n = len(log_probs)
    for top_p in (0.05, 0.9, 0.999):
        found = triton_sampling.nucleus_thresholds(
            log_probs, torch.ones(n, device="cuda"), torch.full((n,), top_p, device="cuda")
        )
        tempered = (log_probs - log_probs.amax(-1, keepdim=True)).cpu()
        assert found.tolist() == [_sorted_thresholds(row, 0, top_p) for row in tempered]
