"""What serves, as it stands now: the device, the dtype, the decode path the start-up checks left (every part of
it: the attention kernel, the fused layers, the linear kernels, the embedding, log-softmax and sampler, the graphs;
and why not faster), the memory pool and the budgets of session memory, the window grid. `GET /v1/system`,
`/ready`, `/v1/models` and `python -m txl_server check` report it."""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import dataclass

import torch

from ..memory_budgets import MemoryBudgets
from .decode_path import CheckedPath
from .worker import Worker


@dataclass(frozen=True)
class PoolReport:
    blocks: int  # blocks that hold positions
    block_size: int  # positions per block
    bytes: int  # the pool's keys and values on the device
    fixed: bool  # allocated once, never grows (admission and preemption when full)


@dataclass(frozen=True)
class WindowReport:
    grid: int  # windows sit on this segment grid (txl.window)
    mem_len: int  # a new session's
    max_mem_len: int
    max_positions: int  # the most positions a memory holds between steps
    same_length: bool


@dataclass(frozen=True)
class PathReport:
    """The decode path that serves (`txl.kernels.DecodePath`), every part in its own words."""

    attention: str  # "triton" | "c" | "torch"
    prefill: str  # "c" | "torch"
    layers: str  # "triton" | "c" | "torch" (layer by layer)
    linear: list[str]  # one kernel, or those each layer shape takes the fastest of
    embedding: str  # "triton" | "torch"
    softmax: str
    sampler: str
    graphs: str  # "cuda" | "static" | "off"


@dataclass(frozen=True)
class DeviceReport:
    """What serves, as it stands now (the graphs may have been turned off since start-up)."""

    device: str
    device_name: str
    dtype: str
    decode_path: PathReport
    attention: str  # the decode path's attention: "triton" | "c" | "torch"
    attention_reason: str | None
    cuda_graphs: str  # "on" | "off"
    cuda_graphs_reason: str | None  # why off; on a CPU, that the buffers run eagerly
    graphs: int  # decoding graphs captured (on a CPU: static buffers built)
    pool: PoolReport
    budgets: MemoryBudgets
    window: WindowReport
    device_ok: bool  # no device error has poisoned the context


def describe(
    worker: Worker, checked: CheckedPath, *, mem_len: int, max_mem_len: int, budgets: MemoryBudgets
) -> DeviceReport:
    pool, model = worker.pool, worker.model
    graphs = worker.runner.graphs
    path = worker.runner.path_now
    on = graphs is not None and graphs.off is None
    if graphs is None:
        reason = checked.graphs_reason
    elif graphs.off is not None:
        reason = graphs.off
    else:
        reason = (
            None if graphs.capture else "static buffers run eagerly: there is nothing to capture on a CPU"
        )
    device = pool.layout.device
    return DeviceReport(
        device=str(device),
        device_name=device_name(device),
        dtype=str(model.dtype).removeprefix("torch."),
        decode_path=PathReport(**{**dataclasses.asdict(path), "linear": list(path.linear)}),
        attention=path.attention,
        attention_reason=checked.attention_reason,
        cuda_graphs="on" if on else "off",
        cuda_graphs_reason=reason,
        graphs=graphs.built if graphs is not None and on else 0,
        pool=PoolReport(pool.capacity, pool.block_size, pool.n_blocks * pool.block_nbytes, not pool.growable),
        budgets=budgets,
        window=WindowReport(
            worker.grid, mem_len, max_mem_len, worker.max_positions, model.config.same_length
        ),
        device_ok=worker.device_error is None,
    )


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
