"""The engine on a CUDA device, against that device's memory-bandwidth floor.

Run it on a CUDA host (`python -m bench gpu`); on a machine without CUDA it measures nothing and leaves the
section it has. The device and its bandwidth (a device-to-device copy of 2 GiB, bytes read + written) are
measured in the same run; a decode step's floor is the bytes it must read (weights, the rows' memory, the
positional table: `txl_server.check.floor.bytes_per_token`, with the weights read once per step whatever the
batch) divided by that bandwidth.

Decoding is measured at the model's own mem_len (what the server serves it at: 1,600 for wt103), each row's
memory full, so that the floor counts its keys and values, the regime users run in. In this order, the section
written out after each part (`--out`), so that a run cut short keeps what it measured:

- the fused body's kernels alone (`bench/gpu_micro.py`): the row linears with their LayerNorm at 1, 16 and 64
  rows and the fused attention at 1 and 64 rows, against their floors;
- the CUDA kernels of one wt103 decoding iteration, counted by torch.profiler (what the meta-device count of
  launches, tests/server/engine/test_step_counts.py, cannot see: cuBLAS's split products, topk's passes);
- wt103 shape (random weights), decode at batch 1 and mem 1,600: the engine's decoding iteration
  (`ModelRunner`: sampling on the device, CUDA graph, Triton attention) and the same without the graph;
- 64 sessions at mem 1,600, float32 and bfloat16: tokens/s through the same iteration;
- scoring 4,096 tokens in segments of 128 at mem 1,600 through the worker (sums kept on the device);
- the bundled model served over HTTP (a real server process, `TXL_DEVICE=cuda`), 64 concurrent streams.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import txl
from txl.kernels import fastest
from txl.sampling import SamplingParams
from txl_server.check.benchmark_docs import Section
from txl_server.check.floor import bytes_per_token, copy_bandwidth
from txl_server.engine.graphs import DecodeGraphs
from txl_server.engine.jobs import AdvanceJob, job_result
from txl_server.engine.rows import DecodeRow
from txl_server.engine.runner import ModelRunner
from txl_server.engine.worker import Worker

from . import gpu_micro
from .engine import WordIds
from .http import Server, concurrent
from .paper_table9 import wt103_model


@dataclass(frozen=True)
class Sizes:
    mem: int = 0  # positions of each row's memory; 0: the model's mem_len (as served)
    sessions: int = 64
    steps: int = 64
    document: int = 4096
    streams: int = 64


def _rows(model: txl.TransfoXLLMHeadModel, pool: txl.BlockPool, n: int, mem: int) -> list[DecodeRow]:
    layout = model.memory_layout()
    shape = (n, layout.n_head, mem, layout.d_head)
    tensors = {
        f"{kind}.{i}": torch.randn(shape, dtype=layout.dtype, device=layout.device)
        for kind in ("keys", "values")
        for i in range(layout.n_layer)
    }
    memory = txl.Memory.from_tensors(layout, tensors, mem_len=mem, pool=pool)
    hidden = torch.randn(n, model.config.d_model, dtype=layout.dtype, device=layout.device)
    params = SamplingParams(temperature=1.0)
    return [DecodeRow(memory.row(i), hidden[i], params, seed=i, counter=0) for i in range(n)]


def decode_rate(model: txl.TransfoXLLMHeadModel, rows: int, sizes: Sizes, graphs: bool) -> float:
    """Seconds per iteration of `rows` rows decoding, chained, through the engine's runner."""
    layout = model.memory_layout()
    blocks = rows * (sizes.mem // 16 + 4) + 64
    pool = txl.BlockPool(layout, blocks=blocks, growable=False)
    path = fastest(layout.device)  # as a server's start-up chooses where its checks pass
    decode_graphs = None
    if graphs:
        path = dataclasses.replace(path, graphs="cuda" if layout.device.type == "cuda" else "static")
        decode_graphs = DecodeGraphs(
            model,
            pool,
            path,
            eager=ModelRunner(model, pool, path).decode,
            max_batch_size=rows,
            max_positions=sizes.mem,
        )
        decode_graphs.capture_all()  # as at a server's start-up: nothing is captured while serving
    runner = ModelRunner(model, pool, path, decode_graphs)
    current = _rows(model, pool, rows, sizes.mem)

    def step() -> None:
        nonlocal current
        out, _ = runner.run(current, [])
        current = [
            DecodeRow(o.memory, o.last_hidden, r.params, r.seed, r.counter + 1)
            for o, r in zip(out, current, strict=True)
        ]

    for _ in range(3):
        step()
    started = time.perf_counter()
    for _ in range(sizes.steps):
        step()  # each iteration reads its sampled ids back: synchronised
    return (time.perf_counter() - started) / sizes.steps


def scoring_rate(model: txl.TransfoXLLMHeadModel, sizes: Sizes) -> float:
    """Tokens/s scoring one document through the worker."""
    document = torch.randint(0, 20000, (sizes.document,), generator=torch.Generator().manual_seed(0)).tolist()

    async def main() -> float:
        worker = Worker(
            model, WordIds(), segment_len=128, max_batch_size=64, max_queued=64, path=fastest(model.device)
        )
        worker.start()
        try:
            empty = worker.empty_state(sizes.mem)
            await job_result(worker, AdvanceJob(empty, document[:256]))  # warm-up
            started = time.perf_counter()
            await job_result(worker, AdvanceJob(empty, document))
            return sizes.document / (time.perf_counter() - started)
        finally:
            worker.stop()

    return asyncio.run(main())


def kernel_counts(model: txl.TransfoXLLMHeadModel, rows: int, mem: int) -> list[list[object]]:
    """The CUDA kernels of one eager decoding iteration of `rows` rows (the graph replays the same ones), as
    torch.profiler sees them: (group, kernels) rows, then the total."""
    from torch.profiler import ProfilerActivity, profile

    layout = model.memory_layout()
    pool = txl.BlockPool(layout, blocks=rows * (mem // 16 + 4) + 64, growable=False)
    runner = ModelRunner(model, pool, fastest(layout.device))
    current = _rows(model, pool, rows, mem)
    runner.run(current, [])  # warm: compiled, tables made
    current = _rows(model, pool, rows, mem)
    with profile(activities=[ProfilerActivity.CUDA]) as profiled:
        runner.run(current, [])
        torch.cuda.synchronize(layout.device)
    groups: collections.Counter[str] = collections.Counter()
    for event in profiled.events():
        if event.device_type != torch.autograd.DeviceType.CUDA or event.name.startswith(("Memcpy", "Memset")):
            continue
        name = event.name.lower()
        kind = next((k for k, words in KERNEL_KINDS if any(w in name for w in words)), "other")
        groups[kind] += 1
    return [[kind, n] for kind, n in groups.most_common()] + [["all", sum(groups.values())]]


# Kernel names by what made them: Triton's (named as their functions), cuBLAS's, sorting and selection.
KERNEL_KINDS = (
    ("Triton (fused body, sampling)", ("rows_linear", "layer_norm_rows", "decode_attention", "adaptive_embedding",
                                       "stats", "write", "row_max", "nucleus_pass", "draw")),
    ("cuBLAS products", ("gemm", "gemv", "cutlass", "splitk", "sm90_", "sm80_", "cublas")),
    ("top-k selection", ("topk", "radix", "sort", "bitonic")),
)  # fmt: skip


def measure(
    device: torch.device, sizes: Sizes, *, http: bool = True, keep: Callable[[Section], None] | None = None
) -> Section:
    """Every part in turn; `keep(section)` after each (the section so far written out)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    section = Section("gpu", f"GPU: the engine against the bandwidth floor ({name})", "python -m bench gpu")
    section.note(__doc__.split("\n\n", 1)[1].strip())

    def kept() -> None:
        if keep is not None:
            keep(section)

    bandwidth = copy_bandwidth(device, 2048)  # 2 GiB
    section.note(
        f"Device: {name}; copy bandwidth {bandwidth / 1e9:,.0f} GB/s; decode path: {fastest(device).describe()}."
    )
    kernels = gpu_micro.linear_cases(device, torch.bfloat16) + gpu_micro.attention_cases(
        device, torch.bfloat16
    )
    section.table(
        "The fused body's kernels alone, wt103 shape, bfloat16 (in a CUDA graph of repeated calls)",
        gpu_micro.HEADER,
        gpu_micro.measure(kernels, bandwidth, gpu_micro.cuda_graph_timer),
    )
    kept()
    bf16 = wt103_model().to(device=device, dtype=torch.bfloat16)
    sizes = dataclasses.replace(sizes, mem=sizes.mem or bf16.config.mem_len)
    for rows in (1, 64):
        section.table(
            f"CUDA kernels of one decoding iteration, wt103 shape, bfloat16, {rows} row(s), mem {sizes.mem:,} "
            "(torch.profiler)",
            ["made by", "kernels"],
            kernel_counts(bf16, rows, sizes.mem),
        )
    kept()
    del bf16
    fp32 = wt103_model().to(device)
    rows = []
    one_graph = decode_rate(fp32, 1, sizes, graphs=True)
    one_eager = decode_rate(fp32, 1, sizes, graphs=False)
    floor_one = bytes_per_token(fp32, sizes.mem) / bandwidth
    rows.append(
        [
            "float32, 1 row, CUDA graph",
            one_graph * 1000,
            1 / one_graph,
            floor_one * 1000,
            one_graph / floor_one,
        ]
    )
    rows.append(
        ["float32, 1 row, eager", one_eager * 1000, 1 / one_eager, floor_one * 1000, one_eager / floor_one]
    )
    caption = f"wt103 shape, decode at mem {sizes.mem:,}: one iteration"
    header = ["what", "ms per iteration", "tokens/s", "floor (ms)", "x floor"]
    section.table(caption, header, rows)
    kept()
    # bfloat16 at 1, 16 and 64 rows: the rows of docs/benchmarks.md's estimate of the wt103 step.
    for dtype, batches in ((torch.float32, (sizes.sessions,)), (torch.bfloat16, (1, 16, sizes.sessions))):
        model = fp32 if dtype == torch.float32 else wt103_model().to(device=device, dtype=dtype)
        for batch in batches:
            seconds = decode_rate(model, batch, sizes, graphs=True)
            floor = (bytes_per_token(model, 0) + batch * bytes_per_token(model, sizes.mem)
                     - batch * bytes_per_token(model, 0)) / bandwidth  # fmt: skip
            label = f"{str(dtype).removeprefix('torch.')}, {batch} row(s), CUDA graph"
            rows.append([label, seconds * 1000, batch / seconds, floor * 1000, seconds / floor])
            section.tables.pop()  # the table again, one row longer
            section.table(caption, header, rows)
            kept()
        del model
    score = scoring_rate(fp32, sizes)
    section.table(
        f"wt103 shape, scoring {sizes.document:,} tokens (segments of 128, mem {sizes.mem:,})",
        ["tokens/s", "seconds"],
        [[score, sizes.document / score]],
    )
    kept()
    if http:
        server = Server(None, env={"TXL_DEVICE": device.type})
        try:
            stats = asyncio.run(concurrent(server.url, sizes.streams, 32))
        finally:
            server.stop()
        section.table(
            f"bundled model over HTTP, {sizes.streams} concurrent streams",
            ["tokens/s", "TTFT p50 (ms)", "TTFT p99 (ms)", "ITL p50 (ms)", "ITL p99 (ms)"],
            [[stats["tokens_per_s"], stats["ttft_p50"] * 1000, stats["ttft_p99"] * 1000,
              stats["itl_p50"] * 1000, stats["itl_p99"] * 1000]],
        )  # fmt: skip
    section.note(
        "Targets (issue 12): decode at batch 1 within 1.0 ms per token; 64 sessions at least 5,000 tokens/s in "
        "float32 and 10,000 in bfloat16; HTTP with 64 streams at least 5,000 tokens/s with TTFT p50 under 50 ms; "
        "scoring at least 50,000 tokens/s."
    )
    kept()
    return section


def run(quick: bool = False, out: Path | None = None) -> Section | None:
    """`out`: the results folder, where the section is written after each part (`python -m bench` passes it)."""
    if not torch.cuda.is_available():
        print("no CUDA device here: the GPU suite measures nothing (its section is left as it is)")
        return None
    sizes = Sizes(steps=16, document=1024, streams=16) if quick else Sizes()
    keep = (lambda section: section.save(out)) if out is not None else None
    return measure(torch.device("cuda"), sizes, keep=keep)
