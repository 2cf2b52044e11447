"""What the Responses routes (and the Conversations routes, which share their turns) work with, one per running
service: its response turns, conversations and background jobs."""

from __future__ import annotations

from fastapi import FastAPI, Request

from ...sessions.background import BackgroundJobs
from ...sessions.conversations import ConversationService
from ...sessions.responses import ResponseTurns
from ...sessions.service import SessionService
from ...sessions.store.conversations import ConversationStore
from ...sessions.store.jobs import JobStore
from ...sessions.store.responses import ResponseStore
from ...settings import Settings
from ..shared.dependencies import AppSettings, Service


class Responses:
    """What the Responses routes work with, one per running service: its turns, conversations and jobs."""

    def __init__(self, service: SessionService, settings: Settings) -> None:
        self.service = service
        self.turns = ResponseTurns(
            service, ResponseStore(service.store, keep_versions=settings.keep_versions)
        )
        store = ConversationStore(service.store, replica=service.replica.id)
        self.conversations = ConversationService(service, store)
        jobs = JobStore(service.store)
        self.jobs = BackgroundJobs(jobs, service.stores.heartbeats, holder=service.replica.id)


async def get_responses(request: Request, service: Service, settings: AppSettings) -> Responses:
    """One Responses per running service (a restarted runtime gets a new one)."""
    responses: Responses | None = getattr(request.app.state, "responses", None)
    if responses is None or responses.service is not service:
        responses = request.app.state.responses = Responses(service, settings)
    return responses


async def stop_background(app: FastAPI) -> None:
    """At shutdown, before the runtime stops: the background responses this process runs end as interrupted
    (`failed`, saying so), each writing its end."""
    responses: Responses | None = getattr(app.state, "responses", None)
    if responses is not None:
        await responses.jobs.stop()
