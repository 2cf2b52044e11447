"""The fused decoding body's Triton kernels (txl.paged.gpu_decode), under Triton's interpreter where no GPU is
present: each kernel against the torch path or the float64 computation of its contract, and a tiny model decoding
through the body against the torch path."""

from __future__ import annotations

import json

import pytest
import torch
from txl.kernels.triton import attention as triton_attention
from txl.kernels.triton import common as triton_common
from txl.kernels.triton import layer_norm as triton_layer_norm
from txl.kernels.triton import rows_linear as triton_rows_linear

from tests.helpers.interpreted import run_interpreted

needs_triton = pytest.mark.skipif(triton_common.triton is None, reason="triton is not installed")


def interpreted(*arguments: str) -> dict:
    """Runs tests/model/fused_interpreted.py in a process of its own (Triton reads the switch when imported)."""
    done = run_interpreted("tests.model.fused_interpreted", *arguments, timeout=420, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_triton
def test_each_kernel_of_the_fused_body_meets_its_contract():
    """The fused attention (float32 and bfloat16 pools, block sizes 1, 4, 12 and 16, split one tile a partition,
    the default plan and one partition) equals the float64 computation of q + u and q + v scaled, the positional
    product, attention over the row's keys with the new one from the projection, and writes that key and value
    to the planned slot; the row linears (tiles of 16, 32 and 64 rows, split or not) equal x @ W^T + b and
    LayerNorm(residual + relu(x + b1) @ W^T + b); the adaptive embedding and log-softmax equal the torch path's."""
    result = interpreted("kernels", "2025")
    attention, linear, adaptive = result["attention"], result["linear"], result["adaptive"]
    assert attention["written"] and attention["launches"] == 24
    assert attention["max_error"]["float32"] < 1e-5 and attention["max_error"]["bfloat16"] < 0.02
    assert linear["max_error"]["float32"] < 1e-5 and linear["max_error"]["bfloat16"] < 0.02
    for dtype, errors in adaptive.items():
        assert errors["log_probs"] < 1e-4, dtype  # the same logits as the torch path's: float32 rounding
        assert errors["embedding_ulps"] <= 2, dtype  # the products summed in another order


@needs_triton
def test_a_model_decodes_through_the_fused_body_as_through_the_torch_path():
    """float32: to rounding, memories of 0, 1, block boundaries and long ones split across partitions, HF's
    windows and same_length. bfloat16: both against float32, the fused body about as close as the torch path."""
    result = interpreted("model")
    assert all(error < 1e-5 for error in result["float32"].values()), result
    assert result["bfloat16_fused_error"] <= 1.5 * result["bfloat16_torch_error"] + 1e-3, result


def test_row_linears_split_their_inputs_to_fill_the_gpu_at_batch_one():
    # wt103's FF output (1,024 x 4,096) at batch 1: 32 tiles of 32 outputs (the LayerNorm's tiles), the inputs
    # cut in 16 ranges; without the LayerNorm, 16 tiles of 64 outputs.
    plan = triton_rows_linear.plan_rows(rows=1, outputs=1024, inputs=4096, sms=132, norm=True)
    assert (plan.block_m, plan.block_n, plan.splits) == (16, 32, 16)
    assert plan.k_per_split * plan.splits >= 4096 and plan.k_per_split % plan.block_k == 0
    plain = triton_rows_linear.plan_rows(rows=1, outputs=1024, inputs=4096, sms=132)
    assert (plain.block_n, plain.splits, plain.k_per_split) == (64, 16, 256)
    # 64 rows: tiles of 64 rows and 32 outputs, the same splits (the same sums, in the same order, for a row).
    wide = triton_rows_linear.plan_rows(rows=64, outputs=1024, inputs=4096, sms=132, norm=True)
    assert (wide.block_m, wide.block_n) == (64, 32) and (wide.splits, wide.k_per_split) == (16, 256)


@needs_triton
def test_no_program_of_a_row_linear_reads_its_layer_norm_one_row_after_another():
    """Review round 3, finding 1: with 16 splits, the one program that arrived last normalised every row of its
    block, reading each row's 16 partial rows in turn: 277 loads at 16 rows, 1,093 at 64 (on an H200 about
    100-160 us a launch, 4-6 ms of a wt103 step at batch 64). Now each tile's last split sums its own tile, four
    partial tiles a read, and the rows are normalised four at a time from per-tile statistics: by the last tile
    up to 16 rows, else by a launch of one program per four rows. A row gives the same bits whichever way
    (products of small integers, exact in any order: alone, in 5, in 40, and in a padded bucket of 64)."""
    done = run_interpreted("tests.model.loads_interpreted", "rows_linear", timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    (in_kernel,) = result["tails"]["16"]
    assert in_kernel["most"] <= 48, result
    product, layer_norm = result["tails"]["64"]
    assert product["most"] <= 24 and layer_norm["most"] <= 8 and layer_norm["programs"] == 16, result
    assert result["same_bits"] == {"float32": True, "bfloat16": True}


def test_the_fused_attention_partitions_hold_two_tiles_of_keys():
    """Whatever the batch or the table's width, a row's keys are cut at the same places (a graph's wider table
    only adds empty partitions), two tiles a partition: at batch 1 a program reads two tiles in turn, not four
    (review round 3, finding 2: about 0.1 ms a wt103 step); one tile would add 6% to the bytes a step moves at 64
    rows (the partitions' sums), for little more at batch 1 (docs/benchmarks.md, the estimate)."""
    for d_head in (8, 16, 64, 128):
        tile, warps = triton_attention.tile_and_warps(d_head)
        plan = triton_attention.plan_partitions(d_head=d_head, table_width=40, block_size=16, n_pos=600)
        assert plan.partition == 2 * plan.tile == 2 * tile and warps in (1, 2)
    eager = triton_attention.plan_partitions(d_head=64, table_width=101, block_size=16, n_pos=1601)
    graph = triton_attention.plan_partitions(d_head=64, table_width=120, block_size=16, n_pos=1601)
    assert eager.partition == graph.partition == 32 and eager.partitions == graph.partitions == 51
    short = triton_attention.plan_partitions(d_head=64, table_width=1, block_size=16, n_pos=1)
    assert short.partitions == 1 and not short.split


@needs_triton
def test_the_fused_kernels_do_not_specialise_on_what_changes_from_step_to_step():
    """Nor on the batch; the row linears do specialise on the weight's shape (fixed per layer, compiled at
    warm-up), which makes their loads 16-byte vectors (tests/model/test_triton_compiled.py)."""
    attention = {p.name for p in triton_attention.jit_kernel().params if p.do_not_specialize}
    assert {"B", "S", "NB", "P", "P_TAB", "partition", "num_parts"} <= attention
    linear = {p.name for p in triton_rows_linear.jit_kernel().params if p.do_not_specialize}
    assert "M" in linear and not {"N", "K", "k_per_split"} & linear
    layer_norm = {p.name for p in triton_layer_norm.jit_kernel().params if p.do_not_specialize}
    assert "M" in layer_norm


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_model_decodes_through_the_fused_body_on_cuda():
    from txl.kernels import DecodePath

    from tests.helpers.tiny_models import tiny_model

    from .test_kernels import _decode_both_ways

    model = tiny_model(seed=24, mem_len=150, clamp_len=40).cuda()
    lengths = [0, 1, 3, 4, 5, 70, 200]
    got, expected = _decode_both_ways(
        model, lengths, mem_len=150, block_size=4, steps=2, path=DecodePath.triton()
    )
    assert float((got - expected).abs().max()) < 1e-4
