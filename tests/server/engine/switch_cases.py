"""The switches users know, in every combination, on the static-buffer path: `python -m tests.server.engine.switch_cases
MODEL_DIR` starts a worker for each combination of TXL_CUDA_GRAPHS and TXL_TRITON_KERNELS as the server does (its
start-up checks included), generates from a few prompts, and prints one JSON line per combination.

A process of its own, run with TRITON_INTERPRET=1 (Triton reads it when imported), so that the Triton kernel
runs on the CPU under its interpreter where a GPU would run it compiled."""

from __future__ import annotations

import asyncio
import json
import sys

from txl.sampling import SamplingParams
from txl_server.engine.device_report import describe
from txl_server.engine.jobs import GenerateJob, job_result
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


def main() -> None:
    model_dir = sys.argv[1]
    for graphs in (False, True):
        for triton in (False, True):
            settings = Settings(model=model_dir, cuda_graphs=graphs, triton_kernels=triton, max_batch_size=1)
            loaded = load_model(settings)
            worker = make_worker(settings, loaded)
            path = prepare_worker(settings, worker)
            mem_len, largest = settings.mem_lens(loaded[0].config.mem_len)
            report = describe(worker, path, mem_len=mem_len, max_mem_len=largest)
            worker.start()
            try:
                tokens = asyncio.run(generate(worker, loaded[1], mem_len))
            finally:
                worker.stop()
            line = {"graphs": graphs, "triton": triton, "attention": report.attention,
                    "cuda_graphs": report.cuda_graphs, "checks_ok": not path.failures, "tokens": tokens}  # fmt: skip
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
