"""The services of OpenAI's Responses and Conversations APIs, which stand beside the session service and build on it:
response turns (responses.py), conversations (conversations.py) and background jobs (background.py), each over a
Redis store of its own. The runtime builds them once at start-up (runtime.py), as it builds the session service,
and stops the background jobs at shutdown before the session service lets its sessions go; the HTTP layer only
calls them."""

from __future__ import annotations

from dataclasses import dataclass

from .background import BackgroundJobs
from .conversations import ConversationService
from .responses import ResponseTurns
from .service import SessionService
from .store.conversations import ConversationStore
from .store.jobs import JobStore
from .store.responses import ResponseStore


@dataclass(frozen=True)
class ResponsesServices:
    turns: ResponseTurns
    conversations: ConversationService
    jobs: BackgroundJobs

    @classmethod
    def over(cls, service: SessionService, *, keep_versions: int) -> ResponsesServices:
        """The services on `service`'s sessions and Redis; stored responses live while their session keeps the
        version they name (`keep_versions`, as the session does)."""
        replica = service.replica.id  # names what this process holds: conversations' locks, running jobs
        return cls(
            turns=ResponseTurns(service, ResponseStore(service.store, keep_versions=keep_versions)),
            conversations=ConversationService(service, ConversationStore(service.store, replica=replica)),
            jobs=BackgroundJobs(JobStore(service.store), service.stores.heartbeats, holder=replica),
        )

    async def stop(self) -> None:
        """At shutdown, before the session service stops: the background responses this process runs end as
        interrupted (`failed`, saying so), each writing its end."""
        await self.jobs.stop()
