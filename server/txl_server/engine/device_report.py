"""What serves, as it stands now: the device, the dtype, the attention kernel and the graphs the start-up checks
left on (and why not), the memory pool and the budgets of session memory, the window grid. `GET /v1/system`,
`/ready`, `/v1/models` and `python -m txl_server check` report it."""

from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from ..memory_budgets import MemoryBudgets
from .selfcheck import ServingPath
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
class DeviceReport:
    """What serves, as it stands now (the graphs may have been turned off since start-up)."""

    device: str
    device_name: str
    dtype: str
    attention: str  # "triton" | "c" | "torch"
    attention_reason: str | None
    cuda_graphs: str  # "on" | "off"
    cuda_graphs_reason: str | None  # why off; on a CPU, that the buffers run eagerly
    graphs: int  # decoding graphs captured (on a CPU: static buffers built)
    pool: PoolReport
    budgets: MemoryBudgets
    window: WindowReport
    device_ok: bool  # no device error has poisoned the context


def describe(
    worker: Worker, path: ServingPath, *, mem_len: int, max_mem_len: int, budgets: MemoryBudgets
) -> DeviceReport:
    pool, model = worker.pool, worker.model
    graphs = worker.runner.graphs
    on = graphs is not None and graphs.off is None
    if graphs is None:
        reason = path.graphs_reason
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
        attention=path.attention,
        attention_reason=path.attention_reason,
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
