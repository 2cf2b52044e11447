"""The byte budgets of session memory: the device tier, the prefix cache beside it, and the host tier.

What the settings leave unset is chosen for the device. On a GPU the device tier is the GPU's memory and the host
tier the machine's RAM: 2 GiB and 4 GiB. On a CPU both would be the same RAM, so the host tier is off (a session
moved off the device is copied from RAM to RAM only to be copied back before its next step; beyond the device
budget sessions go to Redis, or are dropped without persistence), and the device budget is a share of the
machine's memory: a sixteenth of it (or of the container's limit, where lower), and at least room for 16
sessions at their largest, so that a larger model still serves a few. The prefix cache is a quarter of the device
budget, and on a CPU at most the states of 8,192 prompt positions (8 kB of text for the bundled model): a
document scored once should not hold a laptop's RAM.

Budgets are ceilings: a CPU's pool takes memory only as blocks are used, so a server's memory follows the sessions
it holds up to them (`GET /v1/system` reports them, `docs/server.md#memory-tiers` explains them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from txl import TransfoXLLMHeadModel, peak_positions
from txl.window import WindowRule

from .settings import Settings

GPU_DEVICE_BYTES = 2 * 1024**3
GPU_HOST_BYTES = 4 * 1024**3
CPU_SHARE = 16  # a CPU's device budget: this fraction of the machine's memory...
CPU_SESSIONS = 16  # ...and at least room for this many sessions at their largest
CPU_PREFIX_POSITIONS = 8192  # the prefix cache on a CPU: at most the states of this many prompt positions


@dataclass(frozen=True)
class MemoryBudgets:
    device: int  # bytes of session memory on the device: sessions at rest and in flight
    prefix_cache: int  # bytes of prompt states on the device, beside the sessions (0: no prefix cache)
    host: int  # bytes of sessions moved off the device into host RAM (0: none are)
    how: str  # how they were chosen, for a reader


def memory_budgets(settings: Settings, model: TransfoXLLMHeadModel) -> MemoryBudgets:
    """The budgets the settings set, and for the rest the defaults of the model's device (see the module)."""
    on_cpu = model.device.type == "cpu"
    return choose_budgets(
        settings,
        on_cpu=on_cpu,
        session_bytes=session_peak_bytes(settings, model),
        position_bytes=model.memory_layout().bytes_per_position(),
        machine_bytes=machine_memory() if on_cpu else 0,
    )


def choose_budgets(
    settings: Settings, *, on_cpu: bool, session_bytes: int, position_bytes: int, machine_bytes: int
) -> MemoryBudgets:
    """`memory_budgets` from what it measured: one session's memory at its largest, one position's, and the
    machine's memory (CPU only)."""
    how: list[str] = []
    if settings.device_memory_bytes is not None:
        device = settings.device_memory_bytes
        how.append("device: TXL_DEVICE_MEMORY_BYTES")
    elif on_cpu:
        device = max(machine_bytes // CPU_SHARE, CPU_SESSIONS * session_bytes)
        how.append(
            f"device: 1/{CPU_SHARE} of this machine's {machine_bytes / 2**30:.1f} GiB, at least {CPU_SESSIONS} "
            "sessions at their largest"
        )
    else:
        device = GPU_DEVICE_BYTES
        how.append("device: 2 GiB on a GPU")
    if settings.prefix_cache_bytes is not None:
        prefix_cache = settings.prefix_cache_bytes
        how.append("prefix cache: TXL_PREFIX_CACHE_BYTES")
    elif on_cpu:
        prefix_cache = min(device // 4, CPU_PREFIX_POSITIONS * position_bytes)
        how.append(f"prefix cache: a quarter of the device's, at most {CPU_PREFIX_POSITIONS:,} positions")
    else:
        prefix_cache = device // 4
        how.append("prefix cache: a quarter of the device's")
    if settings.host_memory_bytes is not None:
        host = settings.host_memory_bytes
        how.append("host: TXL_HOST_MEMORY_BYTES")
    elif on_cpu:
        host = 0
        how.append("host: none on a CPU (the same memory as the device)")
    else:
        host = GPU_HOST_BYTES
        how.append("host: 4 GiB beside a GPU")
    return MemoryBudgets(device=device, prefix_cache=prefix_cache, host=host, how="; ".join(how))


def session_peak_bytes(settings: Settings, model: TransfoXLLMHeadModel) -> int:
    """What one session's memory can cost at worst, at the largest mem_len the settings allow (what admission
    checks a new session against)."""
    max_mem_len = settings.mem_lens(model.config.mem_len)[1]
    segment_len = settings.segment_len or model.config.segment_len
    held = WindowRule(max_mem_len, model.config.same_length, model.config.segment_len).max_positions
    positions = peak_positions(held, segment_len, settings.block_size)
    return positions * model.memory_layout().bytes_per_position()


CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def machine_memory(limit_files: tuple[Path, ...] = CGROUP_LIMITS) -> int:
    """This machine's memory in bytes, or the container's limit (cgroup v2 or v1) where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in limit_files:
        try:
            limit = limit_file.read_text().strip()
        except OSError:
            continue
        if limit.isdigit():  # cgroup v2 says "max" when there is none
            total = min(total, int(limit))
    return total


def describe_budgets(budgets: MemoryBudgets) -> str:
    """One line for the start-up log."""
    return (
        f"device {mib(budgets.device)}, prefix cache {mib(budgets.prefix_cache)}, host {mib(budgets.host)} "
        f"({budgets.how})"
    )


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"
