"""`bench gpu` starts with the fused body's kernels alone (review round 3, finding 5: measured first, so that the
LayerNorm's cost is known even if a later part fails): the row linears at 1, 16 and 64 rows and the attention at 1
and 64 rows, each against its floor. Run here under Triton's interpreter at a tiny shape, timed by the clock."""

from __future__ import annotations

import json

import pytest
from txl.kernels.triton import common as triton_common

from tests.helpers.interpreted import run_interpreted


@pytest.mark.skipif(triton_common.triton is None, reason="triton is not installed")
def test_the_kernel_table_has_each_row_linear_and_attention_at_their_batches():
    done = run_interpreted("tests.bench.gpu_micro_interpreted", timeout=300, check=True)
    table = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(row[0].split(" (")[0], row[1]) for row in table] == [
        (kernel, rows)
        for rows in (1, 16, 64)
        for kernel in ("output projection + LayerNorm", "feed-forward output + LayerNorm")
    ] + [
        (kernel, rows)
        for rows in (1, 64)
        for kernel in (
            "fused attention",
            "fused attention, partitions of 1 tile",
            "fused attention, partitions of 4 tiles",
        )
    ]
    assert all(
        seconds > 0 and floor > 0 and ratio == pytest.approx(seconds / floor)
        for _, _, seconds, floor, ratio in table
    )
