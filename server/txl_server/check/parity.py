"""Parity, as `python -m txl_server check` measures it through a running worker: a prompt and its greedy
continuation through the engine against the reference, and a seeded generation run twice."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import torch
from txl import TransfoXLLMHeadModel, load_pretrained
from txl.sampling import SamplingParams

from ..engine.comparison import tolerance
from ..engine.jobs import GenerateJob, job_result
from ..engine.worker import Worker
from ..settings import Settings

# The parity prompt (written for this check): ordinary prose, so that a trained model's continuation is too.
TEXT = (
    "The lighthouse keeper wrote in his log every evening, whatever the weather. On the night of the storm he "
    "noted the wind, the height of the waves and the ships he had seen before the rain hid them, and then, "
    "because the lamp needed him more than the log did, he climbed the stairs again and stayed there until "
    "morning. When the sea was calm he read old newspapers and mended the nets of the village below."
)

# In half precision the engine must be about as close to float32 as the reference is in that precision.
HALF_SLACK = 2.0  # times the reference's own distance
HALF_FLOOR = 0.05  # nats, for a reference that happens to round well


@dataclass(frozen=True)
class Parity:
    dtype: str
    grid: int
    mem_len: int
    prompt: int
    generated: int
    same: float  # max |delta log p|, engine against the reference in the served dtype on the device
    same_ok: bool
    fp32: float | None  # engine against the reference in float32 on the CPU (GPU, or half precision)
    fp32_mean: float | None
    reference_fp32: float | None  # the reference in the served dtype against float32: the rounding budget
    reference_fp32_mean: float | None
    fp32_ok: bool
    far_tokens: int  # generated tokens the reference ranks below its best by more than a near tie

    @property
    def positions(self) -> int:
        return self.prompt + self.generated - 1  # the first token has no prediction


async def check_parity(worker: Worker, settings: Settings, *, tokens: int) -> Parity:
    """A prompt and its greedy continuation through the engine, against the reference."""
    model = worker.model
    mem_len = settings.mem_lens(model.config.mem_len)[0]
    prompt = prompt_tokens(worker, tokens)
    job = GenerateJob(
        worker.empty_state(mem_len),
        prompt,
        tokens - len(prompt),
        SamplingParams(temperature=0),
        prompt_logprobs=True,
    )
    result = await job_result(worker, job)
    result.state.release()  # a check keeps nothing in the pool
    sequence = prompt + result.token_ids
    engine = torch.tensor((result.prompt_logprobs or []) + result.token_logprobs, dtype=torch.float64)
    reference, best = await asyncio.to_thread(reference_logprobs, model, sequence, mem_len, worker.grid)
    same = _max_delta(engine, reference)
    half = model.dtype != torch.float32
    limit = tolerance(model.dtype).logprob
    fp32 = fp32_mean = reference_fp32 = reference_fp32_mean = None
    fp32_ok = True
    if model.device.type != "cpu" or half:
        cpu = await asyncio.to_thread(load_pretrained, settings.model_dir)
        exact, _ = await asyncio.to_thread(reference_logprobs, cpu, sequence, mem_len, worker.grid)
        del cpu
        fp32, fp32_mean = _max_delta(engine, exact), _mean_delta(engine, exact)
        reference_fp32, reference_fp32_mean = _max_delta(reference, exact), _mean_delta(reference, exact)
        if half:
            limit = HALF_SLACK * reference_fp32 + HALF_FLOOR
            fp32_ok = fp32 <= limit and fp32_mean <= HALF_SLACK * reference_fp32_mean + HALF_FLOOR / 10
        else:
            fp32_ok = fp32 <= limit
    # A greedy token is the engine's best; the reference may rank another first only by a near tie.
    generated = slice(len(prompt), len(sequence))
    margins = best[generated] - reference[generated]
    far = int((margins > 2 * limit).sum())
    return Parity(
        str(model.dtype).removeprefix("torch."),
        worker.grid,
        mem_len,
        len(prompt),
        len(result.token_ids),
        same,
        same <= limit,
        fp32,
        fp32_mean,
        reference_fp32,
        reference_fp32_mean,
        fp32_ok,
        far,
    )


def prompt_tokens(worker: Worker, tokens: int) -> list[int]:
    """The check's text in the model's tokens, cut to a third of `tokens` (at least 2)."""
    encoded = worker.tokenizer.encode(TEXT)
    return encoded[: max(2, min(len(encoded), tokens // 3))]


@torch.inference_mode()
def reference_logprobs(
    model: TransfoXLLMHeadModel, sequence: list[int], mem_len: int, grid: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p of each token, log p of the best token at each position) [T] float64 on the host, NaN at the first
    position: the model's hidden-state path (HF's function) fed in segments of `grid` from the start, which is
    the function the engine's windows on that grid compute however the tokens arrive (txl.window)."""
    ids = torch.tensor(sequence, dtype=torch.long, device=model.device)[None, :]  # [1, T]
    memory = model.empty_hidden_memory(1, mem_len=mem_len)
    hidden = []
    for start in range(0, ids.size(1), grid):
        out, memory = model(ids[:, start : start + grid], memory)  # [1, t, D]
        hidden.append(out[0])
    predictors = torch.cat(hidden)[:-1]  # [T-1, D]: position i predicts token i + 1
    chosen, best = (
        [torch.tensor([math.nan], dtype=torch.float64)],
        [torch.tensor([math.nan], dtype=torch.float64)],
    )
    for lo in range(0, predictors.size(0), 256):  # the full distribution a few rows at a time
        log_probs = model.log_probs(predictors[lo : lo + 256])  # [n, V] float32
        targets = ids[0, lo + 1 : lo + 1 + log_probs.size(0)]
        chosen.append(log_probs.gather(1, targets[:, None])[:, 0].double().cpu())
        best.append(log_probs.amax(-1).double().cpu())
    return torch.cat(chosen), torch.cat(best)


def _max_delta(a: torch.Tensor, b: torch.Tensor) -> float:
    delta = (a[1:] - b[1:]).abs()
    return float(delta.nan_to_num(math.inf).max()) if delta.numel() else 0.0


def _mean_delta(a: torch.Tensor, b: torch.Tensor) -> float:
    delta = (a[1:] - b[1:]).abs()
    return float(delta.nan_to_num(math.inf).mean()) if delta.numel() else 0.0


async def repeated_generation(worker: Worker, mem_len: int, tokens: int = 48) -> bool:
    """A seeded, sampled generation twice from the same prompt: the same device, dtype and batch path give
    the same tokens."""
    prompt = prompt_tokens(worker, 60)
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=1234)
    runs = []
    for _ in range(2):
        job = GenerateJob(worker.empty_state(mem_len), prompt, tokens, sampling)
        result = await job_result(worker, job)
        result.state.release()
        runs.append(result.token_ids)
    return runs[0] == runs[1]
