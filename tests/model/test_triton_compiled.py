"""The Triton kernels (decoding attention, the fused decoding body, sampling) compile for the GPUs the image targets,
without a GPU, and fit in registers."""

from __future__ import annotations

import pytest

from bench import triton_report

_missing = triton_report.toolchain_missing()
pytestmark = pytest.mark.skipif(_missing is not None, reason=f"cannot compile ahead of time: {_missing}")


def test_kernels_compile_for_sm80_and_sm90_without_spills(capsys):
    rows = []
    for variant in triton_report.standard_variants(archs=(80, 90)):
        usage = triton_report.compile_variant(variant)
        rows.append((variant, usage))
    with capsys.disabled():  # the report, shown with -s or in CI logs
        print("\nTriton kernels compiled ahead of time (registers a thread, spills, shared memory):")
        for variant, usage in rows:
            print(
                f"  {variant.label():58s} {usage.registers:3d} registers, spills {usage.spill_stores}/"
                f"{usage.spill_loads} bytes, stack {usage.stack}, shared {usage.shared} bytes, "
                f"{usage.barriers} barriers, {usage.warps} warp(s)"
            )
    spilling = [variant.label() for variant, usage in rows if usage.spills or usage.stack]
    assert not spilling
    # A thread may hold 255 registers; the attention kernels (one warp a program) stay within 128, so that an SM
    # holds as many programs as it can run, and the 2- and 4-warp kernels within 168 (3 programs of 4 warps an SM).
    for variant, usage in rows:
        limit = 128 if variant.kernel in ("partitions", "combine") else 168
        assert usage.registers <= limit, (variant.label(), usage.registers)


def test_a_block_size_that_is_not_a_power_of_two_compiles():
    variant = triton_report.Variant("partitions", 90, "bfloat16", 64, block_size=12)
    usage = triton_report.compile_variant(variant)
    assert not usage.spills


def test_the_row_linears_stream_their_weights_as_vectors_through_a_pipeline():
    """A product's weights and rows are read in 16-byte vectors, copied asynchronously while the previous tile is
    multiplied. Before, the weight's shape was not specialised on (`do_not_specialize`), so Triton could not
    know a row of W was 16-byte aligned: every load was of one 2-byte number, none of them pipelined."""
    for variant in triton_report.standard_variants(archs=(90,)):
        if variant.kernel == "rows_linear":
            usage = triton_report.compile_variant(variant)
            assert usage.narrow_loads == 0 and usage.async_copies > 0, (variant.label(), usage)
