"""`python -m bench [SUITE ...] [--quick] [--docs | --out DIR]`: run benchmark suites and print their tables.

Each suite's section (Markdown, and its figures) goes to a results folder (results/ by default, not committed),
with a benchmarks.md assembling every section there; `--docs` writes them into docs/ instead, replacing the
committed figures: do that only with numbers from a machine the docs may name."""

from __future__ import annotations

import argparse
import importlib
import inspect
import time
from pathlib import Path

import torch
from txl_server.check.benchmark_docs import ORDER, assemble

from .common import DOCS, RESULTS

SUITES = {
    "model": "bench.model_vs_hf",
    "paper": "bench.paper_table9",
    "floor": "bench.floor",
    "cpu": "bench.cpu",
    "engine": "bench.engine",
    "batching": "bench.batching",
    "persistence": "bench.persistence",
    "chained": "bench.chained",
    "handoff": "bench.handoff",
    "memories": "bench.memories",
    "http": "bench.http",
    "tracing": "bench.tracing",
    "stream": "bench.stream",
    "responses": "bench.responses",
    "memory": "bench.memory",
    "quality": "bench.quality",
    "speedwork": "bench.speedwork",
    "host": "bench.host",
    "prefix": "bench.prefix",
    "turns": "bench.turns",
    "load": "bench.load",
    "gpu": "bench.gpu",
    "gpu_estimate": "bench.gpu_estimate",
    "gpu_kernels": "bench.gpu_kernels",
}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "suites", nargs="*", choices=[*SUITES, []], help=f"default: all ({', '.join(SUITES)})"
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions and smaller inputs (smoke test)"
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (default 2, as on the CI machine)"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--out", type=Path, default=RESULTS, help="the results folder (default: results/, not committed)"
    )
    where.add_argument(
        "--docs",
        action="store_const",
        dest="out",
        const=DOCS,
        help="write into docs/ (the committed figures)",
    )
    return parser


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(args.threads)
    chosen = args.suites or [s for s in ORDER if s in SUITES]
    started = time.perf_counter()
    for name in chosen:
        suite_started = time.perf_counter()
        print(f"\n=== {name} ===", flush=True)
        module = importlib.import_module(SUITES[name])
        # A suite whose `run` takes `out` writes its section there as it goes (a long GPU run cut short keeps
        # what it measured); None: nothing measured here (the GPU suite without a GPU).
        keeps = "out" in inspect.signature(module.run).parameters
        measured = module.run(quick=args.quick, **({"out": args.out} if keeps else {}))
        for section in measured if isinstance(measured, list) else [measured] if measured else []:
            section.save(args.out)
        print(f"({name}: {time.perf_counter() - suite_started:.0f} s)", flush=True)
    path = assemble(args.out)
    print(f"\nwrote {path} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
