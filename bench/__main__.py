"""`python -m bench [SUITE ...] [--quick]`: run benchmark suites, print tables, write docs/benchmarks.md."""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

import torch
from txl_server.check.benchmark_docs import ORDER, assemble

from .common import DOCS

SUITES = {
    "model": "bench.model_vs_hf",
    "paper": "bench.paper_table9",
    "floor": "bench.floor",
    "cpu": "bench.cpu",
    "engine": "bench.engine",
    "batching": "bench.batching",
    "persistence": "bench.persistence",
    "handoff": "bench.handoff",
    "memories": "bench.memories",
    "http": "bench.http",
    "responses": "bench.responses",
    "memory": "bench.memory",
    "quality": "bench.quality",
    "speedwork": "bench.speedwork",
    "host": "bench.host",
    "prefix": "bench.prefix",
    "gpu": "bench.gpu",
    "gpu_kernels": "bench.gpu_kernels",
}


def main() -> None:
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
    parser.add_argument(
        "--docs",
        type=Path,
        default=DOCS,
        help="where the sections (DOCS/benchmarks/SUITE.md) and benchmarks.md go (default: the repository's docs/;"
        " scripts/gpu-check.sh writes under results/)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    chosen = args.suites or [s for s in ORDER if s in SUITES]
    started = time.perf_counter()
    for name in chosen:
        suite_started = time.perf_counter()
        print(f"\n=== {name} ===", flush=True)
        module = importlib.import_module(SUITES[name])
        section = module.run(quick=args.quick)
        if section is not None:  # None: nothing measured here (the GPU suite without a GPU)
            section.save(args.docs)
        print(f"({name}: {time.perf_counter() - suite_started:.0f} s)", flush=True)
    path = assemble(args.docs)
    print(f"\nwrote {path} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
