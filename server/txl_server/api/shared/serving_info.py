"""What the server says about its device and how it serves: the `serving` part of `GET /v1/system` and of
`GET /v1/models` (pydantic, at the edge only; built from `engine.device_report.DeviceReport`)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, Field

from ...engine.device_report import DeviceReport


class PoolInfo(BaseModel):
    blocks: int = Field(description="blocks of the device's memory pool that hold positions")
    block_size: int = Field(description="positions per block")
    bytes: int = Field(description="bytes of keys and values the pool holds on the device")
    fixed: bool = Field(description="allocated once at start-up and never grows (always on a GPU)")


class BudgetsInfo(BaseModel):
    device: int = Field(description="bytes of session memory on the device (TXL_DEVICE_MEMORY_BYTES)")
    prefix_cache: int = Field(
        description="bytes of cached prompt states beside them, 0 when off (TXL_PREFIX_CACHE_BYTES)"
    )
    host: int = Field(
        description="bytes of sessions moved off the device into host RAM (TXL_HOST_MEMORY_BYTES)"
    )
    how: str = Field(description="how they were chosen: set, or the defaults of the device and the machine")


class WindowInfo(BaseModel):
    grid: int = Field(description="every query's window sits on this segment grid")
    mem_len: int = Field(description="a new session's mem_len")
    max_mem_len: int
    max_positions: int = Field(description="the most positions a session's memory holds between steps")
    same_length: bool


class ServingInfo(BaseModel):
    device: str = Field(description="torch device, e.g. cuda:0 or cpu")
    device_name: str
    dtype: str
    attention: Literal["triton", "c", "torch"] = Field(description="the decoding attention kernel in use")
    attention_reason: str | None = Field(description="why a faster kernel is not in use, when one is not")
    cuda_graphs: Literal["on", "off"]
    cuda_graphs_reason: str | None = Field(description="why they are off; on a CPU, what 'on' means there")
    graphs: int = Field(description="decoding graphs captured at start-up (on a CPU: static buffers built)")
    pool: PoolInfo
    budgets: BudgetsInfo = Field(
        description="the byte budgets of session memory (docs/server.md, memory tiers)"
    )
    window: WindowInfo
    device_ok: bool = Field(description="false once a device error has poisoned the context (/ready fails)")

    @classmethod
    def of(cls, report: DeviceReport) -> ServingInfo:
        return cls.model_validate(dataclasses.asdict(report))
