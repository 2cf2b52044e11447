"""The memory-bandwidth floor of a decoding step: the bytes it must read over the bandwidth measured on the device.

At batch 1 a decoding step reads every weight it uses once (the transformer's matrices and the output layer's
clusters) plus the session's memory (keys and values) and the positional keys for that length; its arithmetic is
tiny next to that, so its time is at least bytes / bandwidth. `python -m txl_server check` and the benchmarks
(`bench floor`, `bench gpu`) measure against this one definition.
"""

from __future__ import annotations

import math
import time

import torch
from txl import TransfoXLLMHeadModel


def copy_bandwidth(device: torch.device, mib: int) -> float:
    """Bytes/s of a copy of `mib` MiB on `device` (STREAM's copy: bytes read + written), best of 6."""
    source = torch.ones(mib * 2**20 // 4, device=device)
    target = torch.empty_like(source)
    best = math.inf
    for _ in range(6):
        _synchronize(device)
        started = time.perf_counter()
        target.copy_(source)
        _synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * source.numel() * 4 / best


def weight_bytes(model: TransfoXLLMHeadModel) -> int:
    """Bytes of the weights a decoding step reads: every parameter once (tied ones once), but the positional
    projection, whose products the server serves from a table. (An embedding is read one row per token; as the
    output layer, tied, it is read whole.)"""
    seen: set[int] = set()
    total = 0
    for name, param in model.named_parameters():
        if id(param) in seen or "r_net" in name:
            continue
        seen.add(id(param))
        total += param.numel() * param.element_size()
    return total


def bytes_per_token(model: TransfoXLLMHeadModel, mem: int) -> int:
    """What a decoding step of one row reads with `mem` positions of memory: the weights, the memory's keys and
    values, and the positional keys for that length."""
    element = torch.empty((), dtype=model.dtype).element_size()
    layout = model.memory_layout()
    kv = mem * layout.bytes_per_position()
    positional = (mem + 1) * layout.n_layer * layout.n_head * layout.d_head * element
    return weight_bytes(model) + kv + positional


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
