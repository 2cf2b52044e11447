"""What a decoding iteration through the graphs asks of a GPU, counted on the CPU (tests/server/engine/dispatch_counts.py):
nothing inside the captured body waits for the host, the iteration waits for the device once (reading its
tokens back), what runs outside the graph does not grow with the rows, and a wt103 step through the fused body
(txl.paged.gpu_decode) is a fifth of the kernels of the layer-by-layer path."""

from __future__ import annotations

import pytest
from txl.kernels import triton_common
from txl.sampling import SamplingParams

from .dispatch_counts import one_iteration, wt103_iteration

GREEDY = SamplingParams(temperature=0)
TOP_K = SamplingParams(top_k=40, seed=1)
TOP_P = SamplingParams(temperature=0.8, top_p=0.95, seed=1)


@pytest.mark.parametrize("rows", [1, 64])
def test_a_decoding_iteration_waits_once_and_launches_a_bounded_few_kernels_outside_its_graph(rows):
    counts = one_iteration(rows)
    outside = counts["before"] + counts["after"]
    assert counts["body"]["sync"] == 0 and counts["body"]["h2d"] == 0
    assert outside["sync"] == 1 and counts["after"]["d2h"] == 1
    assert outside["launch"] <= 10 and outside["h2d"] <= 4


def test_what_runs_outside_the_graph_does_not_grow_with_the_rows():
    small, large = one_iteration(2), one_iteration(48)
    for phase in ("before", "after"):
        assert large[phase] == small[phase]


@pytest.fixture
def triton_on_meta(monkeypatch):
    """The Triton kernels chosen on the meta device, each launch standing in as one operation there."""
    if triton_common.triton is None:
        pytest.skip("triton is not installed")
    monkeypatch.setattr(triton_common, "available", lambda device: True)


@pytest.mark.parametrize("batch", [1, 5])
def test_a_wt103_step_through_the_fused_body_launches_at_most_120_kernels_or_140_with_top_p(
    batch, triton_on_meta
):
    """The wt103 shape in bfloat16 at mem_len 1,600: 106 kernels greedy, 107 with top-k, 114 with top-p, whatever
    the batch (the layer-by-layer path: about 600, and 1,360 with top-p's torch search). None waits for the host."""
    counts = {name: wt103_iteration(batch, params, "triton")["body"] for name, params in
              (("greedy", GREEDY), ("top-k", TOP_K), ("top-p", TOP_P))}  # fmt: skip
    assert counts["greedy"]["launch"] <= 120 and counts["top-k"]["launch"] <= 140
    assert counts["top-p"]["launch"] <= 140
    assert all(c["sync"] == 0 and c["h2d"] == 0 for c in counts.values())
    assert {name: c["launch"] for name, c in counts.items()} == {"greedy": 106, "top-k": 107, "top-p": 114}


def test_a_layer_of_the_fused_body_is_five_launches(triton_on_meta):
    """qkv product, attention, output product with its LayerNorm, inner product, outer product with its
    LayerNorm; the layer-by-layer path takes 25."""
    fused = [wt103_iteration(1, GREEDY, "triton", n_layer=n)["body"]["launch"] for n in (1, 2)]
    assert fused[1] - fused[0] == 5
    layered = [wt103_iteration(1, GREEDY, "torch", n_layer=n)["body"]["launch"] for n in (1, 2)]
    assert layered[1] - layered[0] == 25
