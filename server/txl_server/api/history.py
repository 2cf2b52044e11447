"""Session history routes: the versions a session keeps, and going back to one (sessions/history.py)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ..sessions.store.versions import VersionSummary
from .common import ERROR_RESPONSES, Service, SessionObject, Tenant
from .disconnect import WatchedRoute
from .idempotency import Idempotent

router = APIRouter(
    prefix="/v1/sessions", tags=["sessions"], responses=ERROR_RESPONSES, route_class=WatchedRoute
)


class VersionObject(BaseModel):
    version: int
    tokens: int = Field(..., description="Tokens of the session's text at this version")
    created_at: float
    kind: Literal["create", "append", "generate", "import", "rewind", "fork"]
    text_tail: str | None = Field(None, description="The end of the text this step added")

    @classmethod
    def of(cls, summary: VersionSummary) -> VersionObject:
        return cls.model_validate(summary, from_attributes=True)


class VersionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VersionObject] = Field(..., description="Newest first")


class RewindRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(..., ge=1, description="A kept version (GET .../versions) to continue from")


class RewindResponse(BaseModel):
    session: SessionObject


@router.get("/{session_id}/versions", response_model=VersionList)
async def list_versions(session_id: str, service: Service, tenant: Tenant) -> VersionList:
    """The versions the session keeps (TXL_KEEP_VERSIONS), newest first."""
    return VersionList(data=[VersionObject.of(v) for v in await service.history.versions(tenant, session_id)])


@router.post("/{session_id}/rewind", response_model=RewindResponse)
async def rewind(
    session_id: str, body: RewindRequest, service: Service, tenant: Tenant, idempotent: Idempotent
) -> Any:
    """The session continues from a kept version's memory. The rewind is itself a step: a new, higher version
    (history is never lost; another rewind undoes it). A version no longer kept: 404 `version_not_found`."""

    async def step() -> dict[str, Any]:
        meta = await service.history.rewind(tenant, session_id, body.version)
        return RewindResponse(session=SessionObject.of(meta)).model_dump()

    return await idempotent.run(step)
