"""What a decoding iteration through the graphs asks of a GPU, counted on the CPU (tests/server/engine/dispatch_counts.py):
nothing inside the captured body waits for the host, the iteration waits for the device once (reading its
tokens back), what runs outside the graph does not grow with the rows, and a wt103 step through the fused body
(txl.paged.gpu_decode) is a fifth of the launches of the layer-by-layer path."""

from __future__ import annotations

import pytest
from txl.kernels.triton import common as triton_common
from txl.sampling import SamplingParams

from .dispatch_counts import TORCH, TRITON, one_iteration, wt103_iteration

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
def triton_on_meta():
    """The Triton kernels on the meta device (a decode path naming them), each launch standing in as one
    operation there."""
    if triton_common.triton is None:
        pytest.skip("triton is not installed")


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_a_wt103_step_through_the_fused_body_launches_at_most_120_times_or_160_at_64_rows(
    batch, triton_on_meta
):
    """The wt103 shape in bfloat16 at mem_len 1,600: 104 launches greedy, 105 with top-k, 112 with top-p, up to 16
    rows; at 64 rows two more a layer (the row linears' LayerNorms take a launch of their own above 16 rows).
    Launches, not CUDA kernels: a torch operation counts one, though cuBLAS may split a product into two kernels
    and `torch.topk` takes several (`python -m bench gpu` counts the kernels with torch.profiler). The
    layer-by-layer path: about 600, and 1,360 with top-p's torch search. None waits for the host. Before (review
    round 3, finding 3): 106/107/114, with a comparison staging greedy (`ne`) and the output copied into the
    graph's buffer (`copy_`)."""
    counts = {name: wt103_iteration(batch, params, TRITON)["body"] for name, params in
              (("greedy", GREEDY), ("top-k", TOP_K), ("top-p", TOP_P))}  # fmt: skip
    assert all(c["sync"] == 0 and c["h2d"] == 0 for c in counts.values())
    layer_norms = 2 * 18 if batch > 16 else 0
    expected = {"greedy": 104, "top-k": 105, "top-p": 112}
    assert {name: c["launch"] for name, c in counts.items()} == {
        k: v + layer_norms for k, v in expected.items()
    }


def test_a_layer_of_the_fused_body_is_five_launches(triton_on_meta):
    """qkv product, attention, output product with its LayerNorm, inner product, outer product with its
    LayerNorm; the layer-by-layer path takes 25."""
    fused = [wt103_iteration(1, GREEDY, TRITON, n_layer=n)["body"]["launch"] for n in (1, 2)]
    assert fused[1] - fused[0] == 5
    layered = [wt103_iteration(1, GREEDY, TORCH, n_layer=n)["body"]["launch"] for n in (1, 2)]
    assert layered[1] - layered[0] == 25
