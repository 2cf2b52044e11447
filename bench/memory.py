"""Memory per session: exact bytes by dtype and mem_len, how many sessions fit a budget, and peak RSS.

A session holds, per layer, the keys and values of its last `mem_len` positions: n_layer x 2 x n_head x d_head
x bytes per element x mem_len, plus one hidden state (d_model values) that predicts its next token. The
buffers keep headroom so appends happen in place (max(mem_len // 8, 16) positions while decoding; 4 segments while
segments are fed) and the
window compacts rarely; "allocated" is what a session's buffers take once its memory is full.
"""

from __future__ import annotations

import torch
import txl
from txl_server.check.benchmark_docs import Section
from txl_server.engine.state import ModelState

from .common import peak_rss_mib, timeit
from .engine import bundled_model
from .model_vs_hf import random_memory

GIB = 2**30


def _random_state(config: txl.TxlConfig, mem_len: int, dtype: torch.dtype) -> ModelState:
    layout = txl.MemoryLayout(
        config.n_layer, config.n_head, config.d_head, config.d_model, dtype, torch.device("cpu")
    )
    shape = (1, config.n_head, mem_len, config.d_head)
    tensors = {}
    for i in range(config.n_layer):
        tensors[f"keys.{i}"] = torch.randn(shape, dtype=dtype)
        tensors[f"values.{i}"] = torch.randn(shape, dtype=dtype)
    memory = txl.Memory.from_tensors(layout, tensors, mem_len=mem_len)
    return ModelState(memory, torch.randn(config.d_model, dtype=dtype), (1, 2, 3))


def allocated_after_steps(model: txl.TransfoXLLMHeadModel, mem_len: int) -> int:
    """Bytes a session's buffers take once its memory has filled and slid (measured, not computed)."""
    memory = random_memory(model, mem_len, mem_len)
    token = torch.tensor([[1]])
    with torch.inference_mode():
        for _ in range(3):
            _, memory = model(token, memory)
    return memory.allocated_nbytes + model.config.d_model * torch.empty((), dtype=model.dtype).element_size()


def run(quick: bool = False) -> Section:
    section = Section("memory", "Memory per session and sessions per budget", "python -m bench memory")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    small, _, label = bundled_model()
    wt103 = txl.TxlConfig.wt103()
    rows = []
    for name, config in ((label, small.config), ("wt103", wt103)):
        for dtype, size in (("float32", 4), ("bfloat16", 2)):
            for mem_len in (128, 512, 1024, 1600, 3800):
                exact = config.memory_bytes_per_token(size) * mem_len + config.d_model * size
                rows.append([name, dtype, mem_len, exact / 2**20, int(8 * GIB // exact), int(80e9 // exact)])
    section.table(
        "Bytes per session (keys + values of mem_len positions + last hidden state)",
        ["model", "dtype", "mem_len", "MiB per session", "sessions in 8 GiB", "sessions in 80 GB"],
        rows,
    )
    measured = []
    for dtype in (torch.float32, torch.bfloat16):
        model = small.to(dtype)
        for mem_len in (128, 1024):
            exact = model.config.memory_bytes_per_token(torch.empty((), dtype=dtype).element_size()) * mem_len
            allocated = allocated_after_steps(model, mem_len)
            measured.append(
                [
                    str(dtype).removeprefix("torch."),
                    mem_len,
                    exact / 2**20,
                    allocated / 2**20,
                    allocated / exact,
                ]
            )
    small.to(torch.float32)
    section.table(
        f"{label}: exact memory against the buffers actually allocated (after filling and sliding)",
        ["dtype", "mem_len", "exact MiB", "allocated MiB", "allocated / exact"],
        measured,
    )
    rows = []
    for name, config, mem_len in ((label, small.config, small.config.mem_len), ("wt103", wt103, 1600)):
        for dtype in (torch.float32, torch.bfloat16):
            state = _random_state(config, mem_len, dtype)
            data = state.to_bytes()
            layout = state.memory.layout
            save = timeit(state.to_bytes, repeat=3)
            load = timeit(lambda data=data, layout=layout: ModelState.from_bytes(data, layout), repeat=3)
            rows.append(
                [
                    name,
                    str(dtype).removeprefix("torch."),
                    mem_len,
                    len(data) / 2**20,
                    save * 1000,
                    load * 1000,
                ]
            )
    section.table(
        "Session snapshots (what persistence writes to Redis, and what a replica loads)",
        ["model", "dtype", "mem_len", "MiB", "serialise (ms)", "load (ms)"],
        rows,
    )
    section.note(f"Peak RSS of this benchmark process: {peak_rss_mib():,.0f} MiB.")
    return section
