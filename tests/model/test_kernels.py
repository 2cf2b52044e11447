"""Native attention kernels equal the plain torch path they replace."""

from __future__ import annotations

import random

import pytest
import torch
import txl
from txl.kernels import REFERENCE, DecodePath
from txl.kernels.cpu import rows_linear
from txl.kernels.cpu.build import build_library, openmp_runtimes
from txl.kernels.cpu.paged_decode import cpu_paged_decode
from txl.kernels.cpu.rows_linear import cpu_rows_linear

from tests.helpers.tiny_models import tiny_model

from .decode_cases import dense_reference, random_case

needs_cpu_kernel = pytest.mark.skipif(
    cpu_paged_decode() is None, reason="no C compiler here: the CPU decode kernel could not be built"
)


# The C kernel for decoding attention, all else torch's: the kernel alone against the reference.
C_ATTENTION = DecodePath(attention="c")


def _decode_both_ways(model, lengths, *, mem_len, block_size, steps=3, path=C_ATTENTION):
    """Log-probs of `steps` decoding steps from memories of `lengths`, on `path` and on the reference."""
    pool = txl.BlockPool(model.memory_layout(), block_size=block_size)
    generator = torch.Generator().manual_seed(sum(lengths))
    memories = []
    with torch.inference_mode():
        for n in lengths:
            memory = model.empty_memory(1, mem_len=mem_len, pool=pool)
            if n:
                _, memory = model(torch.randint(0, 64, (1, n), generator=generator).to(model.device), memory)
            memories.append(memory)
        outputs = {}
        for name, taken in (("kernel", path), ("reference", REFERENCE)):
            current, out = list(memories), []
            for t in range(steps):
                tokens = torch.full((len(lengths), 1), 3 + t, device=model.device)
                hidden, current = model(tokens, current, path=taken)
                out.append(model.log_probs(hidden, taken))
            outputs[name] = torch.cat(out, dim=1)
    return outputs["kernel"], outputs["reference"]


@needs_cpu_kernel
@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_cpu_decode_kernel_equals_the_torch_path(same_length, block_size):
    model = tiny_model(seed=21, mem_len=19, same_length=same_length, clamp_len=5)
    got, expected = _decode_both_ways(model, [0, 1, 5, 18, 19, 40], mem_len=19, block_size=block_size)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@needs_cpu_kernel
def test_cpu_decode_kernel_reads_bfloat16_memories():
    """In bfloat16 the kernel accumulates in float32 while the torch path multiplies in bfloat16: both are
    measured against float32, and the kernel is at least as close."""
    lengths = [0, 7, 30]
    exact, _ = _decode_both_ways(tiny_model(seed=22, mem_len=12), lengths, mem_len=12, block_size=4)
    got, expected = _decode_both_ways(
        tiny_model(seed=22, mem_len=12).to(torch.bfloat16), lengths, mem_len=12, block_size=4
    )
    kernel_error = (got.float() - exact).abs()
    torch_error = (expected.float() - exact).abs()
    assert kernel_error.mean() <= torch_error.mean() * 1.1 and kernel_error.max() < 0.25


@needs_cpu_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_decode_kernel_meets_the_contract_on_random_rows(dtype):
    """The contract the Triton kernel is held to as well (tests/model/triton_interpreted.py): shuffled blocks,
    rows of different lengths, windows shorter than the memory, a block size that is not a power of two."""
    rng = random.Random(7)
    kernel = cpu_paged_decode()
    for block_size in (1, 4, 16, 12):
        case = random_case(rng, dtype=dtype, block_size=block_size, d_head=24, long=rng.randint(70, 140))
        got = kernel(case.q, case.bd, case.keys, case.values, case.rows)
        error = float((got.double() - dense_reference(case)).abs().max())
        assert error < 1e-5, case.describe()


@needs_cpu_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_decode_kernel_splits_rows_over_torchs_threads_with_the_same_bits(dtype):
    """Each (row, head) is one thread's whole work, so any split gives the same bits, splits that do not divide
    evenly included. Built with OpenMP, the kernel binds to torch's runtime (the process maps one)."""
    kernel = cpu_paged_decode()
    if "OpenMP" in torch.__config__.parallel_info():
        assert kernel.threaded and len(openmp_runtimes()) == 1
    rng = random.Random(3)
    cases = [
        random_case(rng, dtype=dtype, block_size=block_size, d_head=16, heads=5, long=rng.randint(30, 90))
        for block_size in (1, 4, 12)
    ]

    def decode(case):
        return kernel(case.q, case.bd, case.keys, case.values, case.rows)

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [decode(case) for case in cases]
        for threads in (2, 3, 5):
            torch.set_num_threads(threads)
            for case, expected in zip(cases, alone, strict=True):
                assert torch.equal(decode(case), expected), case.describe()
    finally:
        torch.set_num_threads(before)


@needs_cpu_kernel
def test_cpu_decode_kernel_splits_rows_across_threads():
    model = tiny_model(seed=23, mem_len=24)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        got, expected = _decode_both_ways(model, [3] * 4 + [20] * 4, mem_len=24, block_size=4)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_triton_decode_kernel_on_cuda_equals_the_torch_path():
    model = tiny_model(seed=25, mem_len=40, same_length=True).cuda()
    lengths = [0, 5, 40, 100]
    got, expected = _decode_both_ways(
        model, lengths, mem_len=40, block_size=16, path=DecodePath(attention="triton")
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


@pytest.mark.skipif(cpu_rows_linear() is None, reason="no C compiler here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_native_linear_splits_its_outputs_over_torchs_threads_with_the_same_bits(monkeypatch, dtype):
    """Each output is one thread's whole sum: any split gives the bits of one thread, outputs that do not divide
    evenly included; and the split equals F.linear."""
    kernel = cpu_rows_linear()
    if "OpenMP" in torch.__config__.parallel_info():
        assert kernel.threaded
    monkeypatch.setattr(rows_linear, "MIN_BYTES_PER_THREAD", 1)  # split even these small weights
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(333, 70, generator=g).to(dtype)
    bias = torch.randn(333, generator=g).to(dtype)
    x = torch.randn(5, 70, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernel(x, weight, bias)
        for threads in (2, 3, 5):
            torch.set_num_threads(threads)
            assert torch.equal(kernel(x, weight, bias), alone)
    finally:
        torch.set_num_threads(before)
    expected = torch.nn.functional.linear(x, weight.float(), bias.float()).to(dtype)  # float32 sums, rounded
    torch.testing.assert_close(alone, expected, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-4)


@pytest.mark.skipif(cpu_rows_linear() is None, reason="no C compiler here")
def test_a_kernel_is_rebuilt_when_a_header_it_includes_changes(tmp_path, monkeypatch):
    """The cache key of a built kernel covers the headers it includes from beside it (team.h), not only its own
    text: an edited header must not leave a stale library in the cache."""
    monkeypatch.setenv("TXL_KERNEL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "answer.h").write_text("static inline int answer(void) { return 41; }\n")
    source = tmp_path / "probe.c"
    source.write_text('#include "answer.h"\nint txl_probe(void) { return answer(); }\n')
    assert build_library(source).txl_probe() == 41
    (tmp_path / "answer.h").write_text("static inline int answer(void) { return 42; }\n")
    assert build_library(source).txl_probe() == 42
    assert len(list((tmp_path / "cache").glob("probe-*.so"))) == 2
