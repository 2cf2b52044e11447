"""The switches users know, in every combination, on the static-buffer path: `python -m
tests.server.engine.switch_cases MODEL_DIR` starts a worker for each combination of TXL_CUDA_GRAPHS and
TXL_TRITON_KERNELS as the server does (its start-up checks included), generates from a few prompts (greedy, top-p,
top-k), and prints one JSON line per combination. With a fault (`sampling-raises`: Triton's sampling kernel raises,
as in an image without a C compiler; `top-p-differs`: its top-p threshold search keeps only the best token, as a
miscompiled kernel might), once with graphs and Triton on (the start-up check must turn Triton off), then with
neither, the reference.

A process of its own, run with TRITON_INTERPRET=1 (Triton reads it when imported), so that the Triton kernel
runs on the CPU under its interpreter where a GPU would run it compiled."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from txl.kernels.triton import sampling as triton_sampling
from txl.sampling import SamplingParams
from txl_server.engine.device_report import describe
from txl_server.engine.jobs import GenerateJob, job_result
from txl_server.memory_budgets import memory_budgets
from txl_server.runtime import load_model, make_worker, prepare_worker
from txl_server.settings import Settings

PROMPTS = ["The sea was", "1234567890 abc", "a"]
SAMPLING = [SamplingParams(temperature=0), SamplingParams(temperature=0.9, top_p=0.9, seed=7),
            SamplingParams(temperature=1.0, top_k=5, seed=8)]  # fmt: skip


async def generate(worker, tokenizer, mem_len: int) -> list[list[int]]:
    jobs = [
        GenerateJob(worker.empty_state(mem_len), tokenizer.encode(prompt), 5, sampling)
        for prompt, sampling in zip(PROMPTS, SAMPLING, strict=True)
    ]
    return [(await job_result(worker, job)).token_ids for job in jobs]


ORIGINAL_SAMPLE = triton_sampling.sample


def _sampling_raises(*args: object, **kwargs: object) -> None:
    raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")


def _top_p_differs(
    log_probs: Any, temperature: Any, greedy: Any, top_k: Any, top_p: Any, *args: Any, **kwargs: Any
):
    """Top-p's threshold search keeping only the best token (greedy, top-k and their variants right)."""
    return ORIGINAL_SAMPLE(log_probs, temperature, greedy, top_k, top_p * 1e-6, *args, **kwargs)


FAULTS = {"sampling-raises": _sampling_raises, "top-p-differs": _top_p_differs}


def main() -> None:
    model_dir = sys.argv[1]
    combinations = [(graphs, triton) for graphs in (False, True) for triton in (False, True)]
    if sys.argv[2:]:
        triton_sampling.sample = FAULTS[sys.argv[2]]  # type: ignore[assignment]
        combinations = [(True, True), (False, False)]  # then the reference: neither graphs nor Triton
    for graphs, triton in combinations:
        settings = Settings(model=model_dir, cuda_graphs=graphs, triton_kernels=triton, max_batch_size=1)
        loaded = load_model(settings)
        budgets = memory_budgets(settings, loaded[0])
        worker = make_worker(settings, loaded, budgets=budgets)
        path = prepare_worker(settings, worker)
        mem_len, largest = settings.mem_lens(loaded[0].config.mem_len)
        report = describe(worker, path, mem_len=mem_len, max_mem_len=largest, budgets=budgets)
        worker.start()
        try:
            tokens = asyncio.run(generate(worker, loaded[1], mem_len))
        finally:
            worker.stop()
        line = {"graphs": graphs, "triton": triton, "attention": report.attention,
                "attention_reason": report.attention_reason, "cuda_graphs": report.cuda_graphs,
                "checks_ok": not path.failures, "tokens": tokens}  # fmt: skip
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
