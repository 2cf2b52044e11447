"""The split-KV Triton decode kernel: equal to the torch path (under Triton's interpreter where no GPU is present),
split from host-known sizes only, compiled once per shape class, launched under its tensors' device."""

from __future__ import annotations

import contextlib
import json
import random

import pytest
import torch
from txl.kernels.triton import decode as triton_decode
from txl.kernels.triton.decode import PARTITION_KEYS, plan_launch, supports_block_size

from tests.helpers.interpreted import run_interpreted

from .decode_cases import dense_reference, random_case

needs_triton = pytest.mark.skipif(triton_decode.triton is None, reason="triton is not installed")


def _interpreted(*arguments: str) -> dict:
    """Runs tests/model/triton_interpreted.py in a process of its own (Triton reads the switch when imported)."""
    done = run_interpreted("tests.model.triton_interpreted", *arguments, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_triton
@pytest.mark.parametrize("same_length", [False, True])
def test_triton_decode_kernel_equals_the_torch_path_under_the_interpreter(same_length):
    """Decoding a tiny model with the kernel (memories of 0, 1, block boundaries, and long ones split across
    partitions) gives the torch path's log-probabilities."""
    result = _interpreted("model", *(["same_length"] if same_length else []))
    assert result["max_error"] < 1e-5


@needs_triton
def test_triton_decode_kernel_meets_its_contract_on_random_rows():
    """fp32, fp16 and bf16 pools; block sizes 1, 4, 16 and 12; shuffled blocks; rows of different lengths with
    windows shorter than their memories; split by the default plan and into partitions of two 16-key tiles, and
    in one pass: all equal the dense float64 computation. Every launch ran under its tensors' device."""
    result = _interpreted("contract", "2024")
    for dtype, error in result["max_error"].items():
        assert error < 1e-5, result["worst_case"][dtype]
    assert result["guarded"] == ["cpu"]


def test_the_grid_derives_from_host_known_bounds_only():
    # wt103 at batch 1, memory 1,600: 16 (row, head) pairs would leave an H100's 132 SMs idle, so the memory is
    # split into partitions of one 32-key tile; the grid covers the table whatever the rows' lengths.
    plan = plan_launch(batch=1, heads=16, d_head=64, table_width=101, block_size=16, n_pos=1601, sms=132)
    assert (plan.tile, plan.partition, plan.partitions) == (32, 32, 51)
    assert plan.partition * plan.partitions >= 101 * 16
    # A full batch fills the GPU on its own: partitions of a few hundred keys.
    plan = plan_launch(batch=64, heads=16, d_head=64, table_width=101, block_size=16, n_pos=1601, sms=132)
    assert plan.partition == PARTITION_KEYS and plan.partitions == 7
    # Short memories: one partition, and the kernel writes the output itself (no combining launch).
    plan = plan_launch(batch=64, heads=16, d_head=64, table_width=2, block_size=16, n_pos=20, sms=132)
    assert not plan.split
    # A window never reaches beyond the positional scores: n_pos bounds the span, not only the table.
    wide_table = plan_launch(
        batch=1, heads=16, d_head=64, table_width=1000, block_size=16, n_pos=100, sms=132
    )
    assert wide_table.partition * wide_table.partitions < 200


def test_any_positive_block_size_is_supported():
    assert all(supports_block_size(n) for n in (1, 2, 12, 16, 24, 256))
    assert not supports_block_size(0)


@needs_triton
def test_per_step_integers_are_not_specialised():
    """Batch size, table width, pool size, distances and the split vary from step to step: Triton must not
    compile a variant per value class of them (divisible by 16, equal to 1)."""
    partitions, combine = triton_decode.jit_kernels()
    per_step = {"B", "S", "NB", "P", "window_stride", "partition", "num_parts"}
    assert per_step <= {p.name for p in partitions.params if p.do_not_specialize}
    assert {p.name for p in combine.params if p.do_not_specialize} == {"num_parts"}


def test_the_launch_is_guarded_by_the_tensors_device():
    """cuda:1 served from a thread whose current device is cuda:0 launches on cuda:1."""
    guard = triton_decode.device_guard(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert isinstance(triton_decode.device_guard(torch.device("cpu")), contextlib.nullcontext)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_triton_decode_kernel_runs_on_a_second_gpu():
    case = random_case(random.Random(3), dtype=torch.bfloat16, block_size=16, d_head=64, long=700)
    device = torch.device("cuda", 1)
    moved = [t.to(device) for t in (case.q, case.bd, case.keys, case.values)]
    rows = type(case.rows)(*(t.to(device) for t in vars(case.rows).values()))
    with torch.cuda.device(0):
        got = triton_decode.triton_paged_decode(*moved, rows)
    assert got.device == device
    torch.testing.assert_close(got.double().cpu(), dense_reference(case), rtol=0, atol=1e-4)
