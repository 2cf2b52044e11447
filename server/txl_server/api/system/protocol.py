"""What `GET /v1/system` and `/ready` say about the device and how it serves (pydantic, at the edge only)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..shared.chat_template import ChatTemplateInfo
from ..shared.serving_info import ServingInfo


class ReadyInfo(BaseModel):
    """`/ready`'s body: what serves, in brief (unauthenticated; `/v1/system` has the rest)."""

    device: str
    dtype: str
    attention: str
    cuda_graphs: str


class AdmissionInfo(BaseModel):
    """The latency targets requests are admitted to, and the batch as paced now (docs/server.md, "Overload")."""

    ttft_target_seconds: float = Field(
        ..., description="A request is admitted if its first token can come by then"
    )
    tbt_target_seconds: float = Field(..., description="The batch grows only while tokens stay this close")
    measured: bool = Field(..., description="Measured for this device at start-up (else both set)")
    row_cap: int = Field(..., description="Decoding rows the batch may hold now")
    estimate_factor: float = Field(
        ..., description="First tokens' time as they came over the estimate, lately"
    )
    max_concurrent_requests: int
    max_concurrent_requests_per_tenant: int | None


class WorkInfo(BaseModel):
    requests_running: int = Field(
        ...,
        description="Requests the device worker is running now, sharing its forwards (reading a text, scoring, "
        "generating): a client waiting longer than usual for a token sees here what it waits beside",
    )
    requests_waiting: int = Field(
        ..., description="Requests handed to the device worker that it has not yet taken into its forwards"
    )


class SystemInfo(BaseModel):
    object: Literal["system"] = "system"
    model: str
    version: str
    serving: ServingInfo
    admission: AdmissionInfo | None = None
    chat_template: ChatTemplateInfo | None = Field(
        None, description="The chat template in force and where it comes from; null: none (chat answers 404)"
    )
    work: WorkInfo | None = Field(None, description="What the device worker is doing now")
