"""What the GPU kernels cost, counted on a CPU: the Triton decode kernel compiled ahead of time for sm_80/sm_90
(registers, spills, shared memory, barriers) and the programs it launches for the wt103 shape, and the sampling
step at wt103's vocabulary, each against the code it replaced (read from git, commit BEFORE) in the same run."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from txl import sampling
from txl.kernels.triton import decode as triton_decode
from txl_server.check.benchmark_docs import Section

from . import triton_report
from .common import ROOT

BEFORE = (
    "1ffa65d"  # the serial (row, head) kernel and top-p by a sort (CPU: widening candidates, then a sort)
)
WT103 = dict(heads=16, d_head=64, block_size=16, vocab=267_735)


def _module_at(commit: str, path: str, name: str, keep: list[tempfile.TemporaryDirectory[str]]) -> ModuleType:
    """The module at `path` as it was at `commit`, imported under `name` (Triton reads a kernel's source file,
    so it is written to a directory kept alive in `keep`)."""
    source = subprocess.run(
        ["git", "show", f"{commit}:{path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    source = source.replace("from .rows import", "from txl.kernels.decode_rows import")
    folder = tempfile.TemporaryDirectory()
    keep.append(folder)
    file = Path(folder.name) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _old_kernel_usage(old: ModuleType, *, arch: int, kv_dtype: str, d_head: int) -> triton_report.Usage:
    kv = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[kv_dtype]
    signature = {"q": "*fp32", "bd": "*fp32", "keys": f"*{kv}", "values": f"*{kv}", "out": "*fp32"}
    signature |= {name: "*i64" for name in ("table", "starts", "klens", "windows")}
    signature |= {name: "i32" for name in ("B", "H", "S", "NB", "P")}
    constants = {"D": d_head, "BS": WT103["block_size"], "BLOCK_D": 1 << (d_head - 1).bit_length()}
    return triton_report.compile_kernel(old._kernel(), signature, constants, arch=arch, warps=4)


def _usage_cell(usage: triton_report.Usage) -> str:
    spills = "no spills" if not usage.spills else f"spills {usage.spill_stores}/{usage.spill_loads} B"
    return f"{usage.registers} regs, {spills}, {usage.shared} B shared, {usage.barriers} bar.sync"


def _kernel_tables(section: Section, old: ModuleType) -> None:
    rows = []
    for arch in (80, 90):
        for kv_dtype in ("float32", "float16", "bfloat16"):
            for d_head in (64, 128):
                before = _old_kernel_usage(old, arch=arch, kv_dtype=kv_dtype, d_head=d_head)
                after = triton_report.compile_variant(
                    triton_report.Variant("partitions", arch, kv_dtype, d_head)
                )
                rows.append([f"sm_{arch}", kv_dtype, d_head, _usage_cell(before), _usage_cell(after)])
        for d_head in (64, 128):
            combine = triton_report.compile_variant(triton_report.Variant("combine", arch, "float32", d_head))
            rows.append([f"sm_{arch}", "(combine)", d_head, "–", _usage_cell(combine)])
        masses = triton_report.compile_variant(triton_report.Variant("nucleus_pass", arch))
        rows.append([f"sm_{arch}", "(top-p masses)", "–", "(a sort)", _usage_cell(masses)])
    section.table(
        "Kernels compiled for A100 (sm_80) and H100 (sm_90), block size 16: per thread (decode before: 4 warps a "
        "program; after: 1 warp; top-p masses: 4 warps)",
        [
            "GPU",
            "pool dtype",
            "d_head",
            "before (one program per row and head)",
            "after (split-KV partitions)",
        ],
        rows,
    )
    programs = []
    for batch in (1, 8, 64):
        memory = 1600
        width = -(-(memory + 1 + WT103["block_size"] - 1) // WT103["block_size"])  # the table's blocks
        plan = triton_decode.plan_launch(
            batch=batch,
            heads=WT103["heads"],
            d_head=WT103["d_head"],
            table_width=width,
            block_size=WT103["block_size"],
            n_pos=memory + 1,
            sms=triton_decode.DEFAULT_SMS,
        )
        pairs = batch * WT103["heads"]
        after = f"{pairs * plan.partitions:,} x {plan.partition} keys"
        if plan.split:
            after += f" + {pairs:,} combining"
        programs.append([batch, f"{pairs:,} x {memory + 1:,} keys (1 launch)", after, f"{1 + plan.split}"])
    section.table(
        f"Programs a layer launches, wt103 shape (16 heads x 64), memory 1,600, for {triton_decode.DEFAULT_SMS} SMs",
        ["batch", "before: programs x keys each", "after: programs x keys each", "launches after"],
        programs,
    )


def _zipf_log_probs(rows: int, vocab: int, exponent: float, generator: torch.Generator) -> torch.Tensor:
    """[rows, vocab] log-probs falling as rank**-exponent, each row over its own order of the words."""
    base = -exponent * torch.arange(1, vocab + 1, dtype=torch.float64).log()
    logits = torch.stack([base[torch.randperm(vocab, generator=generator)] for _ in range(rows)]).float()
    logits += 0.01 * torch.randn(rows, vocab, generator=generator)  # no exact ties
    return torch.log_softmax(logits, dim=-1)


def _alternating(
    before: Callable[[], object], after: Callable[[], object], *, repeat: int
) -> tuple[float, float]:
    """Fastest seconds of each, run in turns (on a shared machine, load drifts between two separate series)."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, series in ((before, times[0]), (after, times[1])):
            started = time.perf_counter()
            fn()
            series.append(time.perf_counter() - started)
    return min(times[0]), min(times[1])


def _sampling_table(section: Section, old: ModuleType, *, quick: bool) -> None:
    rows, vocab = (8, 50_000) if quick else (64, WT103["vocab"])
    generator = torch.Generator().manual_seed(0)
    narrow = _zipf_log_probs(rows, vocab, 2.0, generator)  # a few words hold 0.9 of the mass
    wide = _zipf_log_probs(rows, vocab, 1.2, generator)  # thousands of words do
    flat = _zipf_log_probs(rows, vocab, 1.0, generator)  # a quarter of the vocabulary and more
    cases = [
        ("temperature 0.8 only", narrow, sampling.SamplingParams(temperature=0.8)),
        ("top_k 50", narrow, sampling.SamplingParams(top_k=50)),
        ("top_p 0.9, narrow nucleus (Zipf 2)", narrow, sampling.SamplingParams(top_p=0.9)),
        ("top_p 0.9, wide nucleus (Zipf 1.2)", wide, sampling.SamplingParams(top_p=0.9)),
        ("top_k 50 + top_p 0.9, wide", wide, sampling.SamplingParams(top_k=50, top_p=0.9)),
        ("top_p 0.95, flat (Zipf 1.0)", flat, sampling.SamplingParams(top_p=0.95)),
    ]
    table = []
    repeat = 2 if quick else 7
    load = os.getloadavg()[0]
    for label, log_probs, params in cases:
        seeds, counters = list(range(rows)), [7] * rows
        built = [m.RowParams.build([params] * rows, seeds, counters, vocab, "cpu") for m in (old, sampling)]
        before_tokens = old.sample_rows(log_probs, built[0])[0]
        after_tokens = sampling.sample_rows(log_probs, built[1])[0]
        kept = torch.isfinite(sampling.truncated_logits(log_probs[0], params)).sum()
        before, after = _alternating(
            lambda lp=log_probs, r=built[0]: old.sample_rows(lp, r),
            lambda lp=log_probs, r=built[1]: sampling.sample_rows(lp, r),
            repeat=repeat,
        )
        same = "yes" if torch.equal(before_tokens, after_tokens) else "no"
        table.append([label, int(kept), before * 1e3, after * 1e3, before / after, same])
    load = max(load, os.getloadavg()[0])
    section.note(
        f"Load average up to {load:.1f} on {os.cpu_count()} cores while sampling was timed: absolute times are "
        "inflated on a shared machine; before and after ran in turns, so each pair shared the load."
    )
    section.table(
        f"Sampling a step on the CPU, [{rows}, {vocab:,}] log-probs, ms (fastest of {repeat}, before and after "
        "in turns)",
        ["parameters", "words kept (row 0)", "before", "after", "speed-up", "same tokens"],
        table,
    )


def run(*, quick: bool = False) -> Section | None:
    section = Section(
        "gpu_kernels",
        "GPU kernels (counted on a CPU)",
        "python -m bench gpu_kernels",
    )
    keep: list[tempfile.TemporaryDirectory[str]] = []
    old_sampling = _module_at(BEFORE, "model/txl/sampling.py", "txl_sampling_before", keep)
    section.note(
        f"Before: commit {BEFORE} (read from git in the same run). Kernels are compiled ahead of time with Triton's "
        "own LLVM and ptxas, no GPU (`bench/triton_report.py`); registers, spills and shared memory are ptxas's "
        "figures, for one thread. The split decode kernel reads the same bytes as before; what changes is how many "
        "programs share them: one per (row, head) left an H100's 132 SMs mostly idle at small batches."
    )
    section.note(
        "Top-p no longer sorts the vocabulary on any device. On a CPU (timed below) the best 1,024 words decide "
        "the rows whose nucleus they cover; the others look at 8,192, then take a search that cuts the range of "
        "logits still in question into 256 parts a step and keeps the part that holds the threshold (before: "
        "the same candidates, widened up to 65,536, then a full sort). On a "
        "GPU every row takes the search: 8 passes of the Triton masses kernel, each reading a row's logits once "
        "(4 bytes a word: 32 bytes a word in all, 0.55 GB for [64, 267,735]), against about 100 bytes a word "
        "for the sort it replaces (4 radix passes over values and int64 indices, read and written). Top-k is a "
        "partial selection (`torch.topk`) as before."
    )
    _sampling_table(section, old_sampling, quick=quick)
    missing = triton_report.toolchain_missing()
    if missing is None:
        old_kernel = _module_at(
            BEFORE, "model/txl/kernels/triton_decode.py", "txl_triton_decode_before", keep
        )
        _kernel_tables(section, old_kernel)
    else:
        section.note(f"Kernel figures skipped: {missing}.")
    return section
