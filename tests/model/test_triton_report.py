"""What the ahead-of-time report compiles is what a GPU runs: the row linears as the fused decoding body launches
them (traced on the meta device), and every kernel with its floating-point contraction stated, not left to
Triton's default (which Triton 3.10 changes, and the bits with it)."""

from __future__ import annotations

import warnings

import pytest
import torch
from txl.kernels.triton import common as triton_common
from txl.kernels.triton import rows_linear as triton_rows_linear
from txl.sampling import SamplingParams

from bench import triton_report
from tests.server.engine.dispatch_counts import TRITON, wt103_iteration

needs_triton = pytest.mark.skipif(triton_common.triton is None, reason="triton is not installed")


def _served_row_linears(monkeypatch, batch: int) -> list[dict[str, object]]:
    """The compile-time constants of every row-linear launch of a wt103 decoding step of `batch` rows."""
    launched = []
    real = triton_common.launch

    def launch(kernel, grid, *args, **constants):
        if kernel is triton_rows_linear.jit_kernel():
            launched.append({k: v for k, v in constants.items() if k not in ("num_warps", "num_stages")})
        return real(kernel, grid, *args, **constants)

    monkeypatch.setattr(triton_common, "launch", launch)
    wt103_iteration(batch, SamplingParams(temperature=0), TRITON, n_layer=1)
    return launched


@needs_triton
@pytest.mark.parametrize("rows", [1, 64])
def test_the_report_compiles_the_row_linears_the_fused_body_launches(monkeypatch, rows):
    """Review round 3, finding 6: the report compiled the row linear with partial products and no LayerNorm
    split off (SPLIT=True), at the feed-forward's inner shape, which the body takes with torch's product."""
    served = _served_row_linears(monkeypatch, rows)
    reported = [
        triton_report.rows_linear_constants(
            triton_report.Variant("rows_linear", 90, "bfloat16", rows=rows, linear=name)
        )
        for name in ("attention_out", "ff_out")
    ]
    assert served[-2:] == reported  # the step's two (after its warm-up's), in a one-layer model
    assert all(constants in reported for constants in served)
    assert {(v.linear, v.rows) for v in triton_report.standard_variants() if v.kernel == "rows_linear"} >= {
        (name, r) for name in ("attention_out", "ff_out") for r in (1, 16, 32, 64)
    }


@needs_triton
def test_every_launch_states_its_floating_point_contraction(monkeypatch):
    seen = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **options: seen.append(options)

    triton_common.launch(Kernel(), (1,), torch.zeros(1), BLOCK=4)
    assert seen == [{"BLOCK": 4, "enable_fp_fusion": triton_common.FP_FUSION}]


@pytest.mark.skipif(triton_report.toolchain_missing() is not None, reason="cannot compile ahead of time")
def test_an_ahead_of_time_compile_leaves_nothing_to_tritons_default(monkeypatch):
    """Triton 3.9 warns, with TRITON_DEFAULT_FP_FUSION unset, that 3.10 will turn contraction off."""
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        triton_report.compile_variant(triton_report.Variant("row_max", 90))
    assert not [w for w in caught if "FP_FUSION" in str(w.message)]
