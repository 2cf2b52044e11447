"""txl against the reference (HF transformers 4.35.2), same weights, wt103-large shape, on this CPU.

Decode step (one token, full next-token distribution), prefill of a 128-token segment (transformer only),
scoring a 4,096-token document in segments of 128 with mem_len 1,600 (target log-probs only), at memory
lengths 0, 400, 1,600 and 3,800. Memories are filled with random states: the cost does not depend on values.
"""

from __future__ import annotations

import time
import warnings

import torch
import txl
from txl.checkpoint import build_model, load_state_dict_strict
from txl.scoring import score_tokens
from txl_server.check.benchmark_docs import Section

from .common import peak_rss_mib, timeit

MEM_LENGTHS = (0, 16, 400, 1600, 3800)
SEGMENT = 128


def reference_model():
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TransfoXLConfig(dropout=0.0)  # the defaults are transfo-xl-wt103's shape
        torch.manual_seed(0)
        return TransfoXLLMHeadModel(config).eval()


def ours_from(reference, dtype=torch.float32) -> txl.TransfoXLLMHeadModel:
    config = txl.TxlConfig.from_dict(reference.config.to_dict())
    model = build_model(config, dtype=dtype)
    load_state_dict_strict(model, reference.state_dict())
    return model


def random_memory(model: txl.TransfoXLLMHeadModel, length: int, mem_len: int) -> txl.Memory:
    layout = model.memory_layout()
    shape = (1, layout.n_head, length, layout.d_head)
    tensors = {}
    for i in range(layout.n_layer):
        tensors[f"keys.{i}"] = torch.randn(shape, dtype=layout.dtype)
        tensors[f"values.{i}"] = torch.randn(shape, dtype=layout.dtype)
    return txl.Memory.from_tensors(layout, tensors, mem_len=mem_len)


def decode_ours(model, mem: int, steps: int) -> float:
    memory = random_memory(model, mem, max(mem, 1)) if mem else model.empty_memory(mem_len=0)
    token = torch.tensor([[42]])
    state = {"memory": memory}

    def step():
        hidden, state["memory"] = model(token, state["memory"])
        model.log_probs(hidden[:, -1])

    with torch.inference_mode():
        return timeit(step, repeat=steps, warmup=2)


def decode_reference(reference, mem: int, steps: int) -> float:
    d = reference.config.d_model
    token = torch.tensor([[42]])
    state = {"mems": [torch.randn(mem, 1, d) for _ in range(reference.config.n_layer)]}
    reference.transformer.mem_len = max(mem, 1)

    def step():
        out = reference(token, mems=state["mems"])
        state["mems"] = out.mems if mem else [m[:0] for m in out.mems]

    with torch.no_grad():
        return timeit(step, repeat=steps, warmup=1)


def prefill_ours(model, mem: int, steps: int) -> float:
    """A segment appended to a full memory, as a session's appends run: each step continues from the last."""
    tokens = torch.randint(0, 20000, (1, SEGMENT))
    state = {"memory": random_memory(model, mem, mem) if mem else model.empty_memory(mem_len=0)}

    def step():
        _, (state["memory"],) = model.transformer(tokens, [state["memory"]])

    with torch.inference_mode():
        return timeit(step, repeat=steps, warmup=1)


def prefill_reference(reference, mem: int, steps: int) -> float:
    d = reference.config.d_model
    tokens = torch.randint(0, 20000, (1, SEGMENT))
    mems = [torch.randn(mem, 1, d) for _ in range(reference.config.n_layer)]
    reference.transformer.mem_len = max(mem, 1)

    def step():
        reference.transformer(tokens, mems=mems)

    with torch.no_grad():
        return timeit(step, repeat=steps, warmup=1)


def score_ours(model, tokens: list[int], mem_len: int) -> float:
    started = time.perf_counter()
    score_tokens(model, tokens, mem_len=mem_len, segment_len=SEGMENT)
    return time.perf_counter() - started


def score_reference(reference, tokens: list[int], mem_len: int) -> float:
    ids = torch.tensor([tokens])
    reference.transformer.mem_len = mem_len
    mems = [torch.empty(0, 1, reference.config.d_model) for _ in range(reference.config.n_layer)]
    started = time.perf_counter()
    with torch.no_grad():
        for start in range(0, ids.size(1), SEGMENT):
            chunk = ids[:, start : start + SEGMENT]
            out = reference(chunk, mems=mems, labels=chunk)
            mems = out.mems
    return time.perf_counter() - started


def run(quick: bool = False) -> Section:
    section = Section(
        "model",
        "Model step: txl against HF transformers 4.35.2 (wt103-large shape)",
        "python -m bench model",
    )
    reference = reference_model()
    ours = ours_from(reference)
    ours_bf16 = ours_from(reference, torch.bfloat16)
    section.note(
        f"Random weights of the `transfo-xl-wt103` shape ({ours.config.param_count() / 1e6:.0f}M parameters: 18 layers, "
        "d_model 1024, 16x64 heads, d_inner 4096, adaptive softmax over 267,735 words with cutoffs "
        "[20000, 40000, 200000], div_val 4), the same weights in both. HF's step re-projects the whole memory "
        "(`mems`) every time; txl reads cached keys/values and a precomputed positional table. Decode = one token "
        "and its full next-token distribution; prefill = one 128-token segment through the transformer; "
        "scoring = target log-probabilities only. bf16 = txl with bfloat16 weights and memory."
    )
    steps = 2 if quick else 3
    rows = []
    decode: dict[int, float] = {}
    for mem in MEM_LENGTHS:
        ours_t = decode_ours(ours, mem, steps + 2)
        decode[mem] = ours_t
        bf16_t = decode_ours(ours_bf16, mem, steps + 2)
        ref_t = decode_reference(reference, mem, steps)
        rows.append([mem, ref_t * 1000, ours_t * 1000, bf16_t * 1000, ref_t / ours_t, ref_t / bf16_t])
    section.table(
        "Decode step, ms per token (batch 1)",
        ["mem_len", "HF fp32", "txl fp32", "txl bf16", "speed-up fp32", "speed-up bf16"],
        rows,
    )
    rows = []
    for mem in (0, 400, 1600, 3800):
        ours_t = prefill_ours(ours, mem, steps)
        bf16_t = prefill_ours(ours_bf16, mem, steps)
        ref_t = prefill_reference(reference, mem, steps)
        rows.append([mem, ref_t * 1000, ours_t * 1000, bf16_t * 1000, ref_t / ours_t, ref_t / bf16_t])
    section.table(
        "Prefill of a 128-token segment, ms",
        ["mem_len", "HF fp32", "txl fp32", "txl bf16", "speed-up fp32", "speed-up bf16"],
        rows,
    )
    doc = torch.randint(
        0, 267735, (1024 if quick else 4096,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    ours_t = score_ours(ours, doc, 1600)
    bf16_t = score_ours(ours_bf16, doc, 1600)
    ref_t = score_reference(reference, doc, 1600)
    section.table(
        f"Scoring a {len(doc):,}-token document in segments of 128, mem_len 1,600, seconds",
        ["HF fp32", "txl fp32", "txl bf16", "speed-up fp32", "speed-up bf16"],
        [[ref_t, ours_t, bf16_t, ref_t / ours_t, ref_t / bf16_t]],
    )
    layout = ours.memory_layout()
    per_session = 1600 * layout.bytes_per_position()
    ratio = decode[1600] / decode[16]
    section.note(
        f"Targets: decode at mem_len 1,600 at least 5x faster than HF; decode at 1,600 at most 2x decode at 16 "
        f"(measured {ratio:.2f}x); scoring at least 3x faster than HF. Memory per session at mem_len 1,600: "
        f"{per_session / 2**20:.0f} MiB in float32 ({per_session / 2 / 2**20:.0f} MiB in bfloat16), exactly "
        f"n_layer x 2 x n_head x d_head x bytes x positions. Peak RSS of this run (HF + txl fp32 + txl bf16 "
        f"models): {peak_rss_mib():,.0f} MiB."
    )
    return section
