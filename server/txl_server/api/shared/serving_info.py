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


class DecodePathInfo(BaseModel):
    attention: Literal["triton", "c", "torch"] = Field(description="decoding attention (one query per row)")
    prefill: Literal["c", "torch"] = Field(description="a prompt segment's attention")
    layers: Literal["triton", "c", "torch"] = Field(
        description="a decoding step's layers fused whole (triton: five launches a layer; c: one native call a "
        "layer, for a few rows), or torch: layer by layer"
    )
    linear: list[Literal["torch", "onednn", "c"]] = Field(
        description="the kernels a CPU's linear layers take: one, or several of which each layer shape takes the "
        "one measured fastest on this machine"
    )
    embedding: Literal["triton", "torch"]
    softmax: Literal["triton", "torch"] = Field(description="the adaptive log-softmax")
    sampler: Literal["triton", "torch"]
    graphs: Literal["cuda", "static", "off"] = Field(
        description="decoding iterations as CUDA graphs, their static buffers run eagerly (a CPU), or neither"
    )


class ServingInfo(BaseModel):
    device: str = Field(description="torch device, e.g. cuda:0 or cpu")
    device_name: str
    dtype: str
    decode_path: DecodePathInfo = Field(
        description="which code runs each part of a decoding step, chosen and checked at start-up"
    )
    attention: Literal["triton", "c", "torch"] = Field(description="the decode path's attention kernel")
    attention_reason: str | None = Field(
        description="why the decode path is not a faster one (its kernels switched off, or they failed their "
        "start-up check), when it is not"
    )
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
