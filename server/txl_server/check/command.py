"""`python -m txl_server check`: the configured model on the configured device, checked and measured.

Loads the model as the server would (the same TXL_* settings and flags), runs the server's own start-up checks
(`engine.selfcheck`: the attention kernel against the torch path, every decoding graph against the eager path),
starts the server's worker, and through it:

- parity: a prompt and a greedy continuation of a few hundred tokens through the engine (prompt segments, then
  one token per step, through the graphs where they are on) against the reference: the model's hidden-state
  path (HF's function: no pool, no kernels, no graphs) over the same tokens in segments of the session window
  grid, where the two compute the same function (txl.window); on a GPU or in half precision, both also against
  that reference in float32 on the CPU;
- a seeded generation run twice (the same tokens);
- the memory pool and the budgets;
- decoding and scoring speed against the memory-bandwidth floor measured in the same run.

Prints a report. Exit status 1 on any correctness failure, 2 when the settings or the model cannot be used.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import ValidationError

from ..engine.device_report import describe
from ..memory_budgets import memory_budgets
from ..settings import Settings
from .gpu_section import repository_docs, write_section
from .parity import check_parity, repeated_generation
from .report import CheckReport, describe_budget, describe_device, describe_parity, describe_speed
from .speed import measure_speed


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m txl_server check",
        description="Check the configured model on the configured device (TXL_* settings; flags win) and "
        "measure it. Exit status 1 on a correctness failure.",
    )
    parser.add_argument("--model", type=Path, help="model directory (TXL_MODEL, default: the bundled model)")
    parser.add_argument("--device", help="torch device, e.g. cuda:0 (TXL_DEVICE, default cpu)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="TXL_DTYPE")
    parser.add_argument("--tokens", type=int, default=300, help="tokens compared for parity (default 300)")
    parser.add_argument("--log-level", default="warning", help="default warning: start-up fallbacks only")
    parser.add_argument(
        "--write-benchmarks",
        action="store_true",
        help="on a GPU, from the repository root: write the GPU section of docs/benchmarks.md",
    )
    parser.add_argument(
        "--docs",
        type=Path,
        help="with --write-benchmarks: the docs directory to write into (default: the repository's docs/)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    overrides = {k: getattr(args, k) for k in ("model", "device", "dtype") if getattr(args, k) is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        print(f"invalid settings: {exc}", file=sys.stderr)
        return 2
    if args.tokens < 16:
        print("--tokens must be at least 16", file=sys.stderr)
        return 2
    if args.write_benchmarks and not settings.device.startswith("cuda"):
        print("--write-benchmarks writes the GPU section: run it with --device cuda", file=sys.stderr)
        return 2
    from ..runtime import load_model, worker_threads

    torch.set_num_threads(worker_threads(settings))
    try:
        loaded = load_model(settings)
    except Exception as exc:
        print(f"cannot load the model in {settings.model_dir}: {exc}", file=sys.stderr)
        return 2
    print(
        f"checking {loaded[2]} from {settings.model_dir} ({settings.dtype} on {settings.device})", flush=True
    )
    report = run_check(settings, loaded, tokens=args.tokens)
    print(report.render())
    if args.write_benchmarks:
        print(f"wrote {write_section(report, args.docs or repository_docs())}")
    return 1 if report.failures else 0


def run_check(settings: Settings, loaded: tuple, *, tokens: int = 300) -> CheckReport:
    """Every check and measurement, on a worker made and prepared as the server makes it."""
    from ..runtime import make_worker, prepare_worker

    budgets = memory_budgets(settings, loaded[0])
    worker = make_worker(settings, loaded, budgets=budgets)
    started = time.perf_counter()
    path = prepare_worker(settings, worker)
    prepared = time.perf_counter() - started
    mem_len, max_mem_len = settings.mem_lens(worker.model.config.mem_len)
    report = CheckReport(describe(worker, path, mem_len=mem_len, max_mem_len=max_mem_len, budgets=budgets))
    describe_device(report, path, prepared)
    if not report.device.device_ok:
        report.add("device", f"failed at start-up: {worker.device_error}", False)
        return report
    worker.start()
    try:
        report.parity = asyncio.run(check_parity(worker, settings, tokens=tokens))
        describe_parity(report, report.parity)
        same = asyncio.run(repeated_generation(worker, mem_len))
        report.add("seeded generation", "the same tokens twice" if same else "different tokens", same)
        describe_budget(report, worker.pool.block_nbytes)
        report.speed = asyncio.run(measure_speed(worker, mem_len))
        describe_speed(report, report.speed)
    finally:
        worker.stop()
    if worker.device_error is not None:
        report.add("device", f"failed while checking: {worker.device_error}", False)
    return report
