"""Run with TRITON_INTERPRET=1 (Triton reads it when imported): `bench gpu`'s kernel measurements at a tiny shape on
the CPU, timed by the wall clock instead of a CUDA graph; prints the table as one JSON line."""

from __future__ import annotations

import json
import time

import torch

from bench import gpu_micro

TINY = dict(d_model=32, heads=2, d_head=16, d_inner=64, mem=40, block_size=16)


def wall_clock(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main() -> None:
    cpu = torch.device("cpu")
    cases = gpu_micro.linear_cases(cpu, torch.float32, TINY) + gpu_micro.attention_cases(
        cpu, torch.float32, TINY
    )
    print(json.dumps(gpu_micro.measure(cases, 1e10, wall_clock)))


if __name__ == "__main__":
    main()
