"""The physical limit of a decode step: bytes that must be read per token, divided by this machine's bandwidth.

At batch 1 a decode step reads every weight it uses once (the transformer's matrices and the output layer's
clusters) plus the session's memory (keys and values) and the positional keys for that length; its arithmetic
is tiny next to that, so time >= bytes / bandwidth. Bandwidth and matrix rate are measured in the same run.
"""

from __future__ import annotations

import torch
from txl_server.check.benchmark_docs import Section
from txl_server.check.floor import bytes_per_token, copy_bandwidth

from .common import timeit
from .model_vs_hf import decode_ours
from .paper_table9 import wt103_model


def read_bandwidth(mib: int = 512) -> float:
    """Bytes/s of reading `mib` MiB (a sum), median of 5."""
    src = torch.ones(mib * 2**20 // 4)
    return src.numel() * 4 / timeit(lambda: src.sum(), repeat=5)


def matmul_rate(dtype: torch.dtype, n: int = 2048) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    seconds = timeit(lambda: a @ b, repeat=5)
    return 2 * n**3 / seconds


def run(quick: bool = False) -> Section:
    section = Section("floor", "Decode against the memory-bandwidth floor", "python -m bench floor")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    mib = 256 if quick else 512
    copy_bw, read_bw = copy_bandwidth(torch.device("cpu"), mib), read_bandwidth(mib)
    rates = {dtype: matmul_rate(dtype) for dtype in (torch.float32, torch.bfloat16)}
    section.table(
        "This machine",
        ["copy bandwidth (GB/s)", "read bandwidth (GB/s)", "fp32 matmul (GFLOP/s)", "bf16 matmul (GFLOP/s)"],
        [[copy_bw / 1e9, read_bw / 1e9, rates[torch.float32] / 1e9, rates[torch.bfloat16] / 1e9]],
    )
    model = wt103_model()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        m = model if dtype == torch.float32 else model.to(dtype)
        for mem in (0, 1600):
            seconds = decode_ours(m, mem, 3 if quick else 6)
            nbytes = bytes_per_token(m, mem)
            floor = nbytes / copy_bw
            rows.append(
                [
                    str(dtype).removeprefix("torch."),
                    mem,
                    nbytes / 2**20,
                    floor * 1000,
                    seconds * 1000,
                    seconds / floor,
                ]
            )
    section.table(
        "Decode step at batch 1 (wt103 shape) against the floor (bytes read / copy bandwidth)",
        ["dtype", "mem_len", "MiB read per token", "floor (ms)", "measured (ms)", "x floor"],
        rows,
    )
    section.note("Target: within 2x of the floor at batch 1.")
    return section
