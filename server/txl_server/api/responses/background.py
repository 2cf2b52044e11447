"""Background responses (`background: true`): answered at once as `queued`, run on in this process, their events
and state written to Redis as they come (sessions/background.py), so that any replica answers a poll
(`GET /v1/responses/{id}`), a cancel, or a stream resumed after a sequence number
(`GET /v1/responses/{id}?stream=true&starting_after=N`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio

from ...errors import ServiceError
from ...metrics import Metrics
from ...sessions.background import INTERRUPTED, BackgroundJobs
from ...sessions.responses import TurnPlace, TurnStarted
from ...sessions.responses_services import ResponsesServices
from ...sessions.step import to_the_end
from ...telemetry.spans import linked, turn_attributes
from ..shared import sse
from ..shared.error_shapes import INTERNAL_ERROR
from ..shared.event_stream import EventStream
from ..shared.json_response import JSONResponse
from ..shared.timing import TokenTiming, timed
from .reply import NumberedEvents, Payload, Reply, ReplyTo, response_events, written

log = logging.getLogger(__name__)

FOLLOW_POLL_SECONDS = 0.02
# A response's state changes with these events: the job's response object is written with them.
STATE_EVENTS = ("response.in_progress", "response.completed", "response.incomplete", "response.failed")


async def start(
    responses: ResponsesServices,
    to: ReplyTo,
    *,
    place: TurnPlace,
    metrics: Metrics,
    held: contextlib.AsyncExitStack,
) -> Any:
    """Writes the job as queued and starts it, its turn on `place` (`held` let go when it ends); the response as
    queued (or, with `stream`, its events)."""
    jobs, body, tenant, meta = responses.jobs, to.body, to.tenant, place.meta
    started = TurnStarted(
        session_id=meta.id,
        version=meta.version + 1,
        cached_tokens=place.cached,
        fed_tokens=len(to.turn.tokens),
    )
    reply = Reply(to, started)
    reply.queued = True
    numbered = NumberedEvents(reply)
    first = reply.object().model_dump()
    announced = [
        numbered.number({"type": t, "response": first}) for t in ("response.created", "response.queued")
    ]
    try:
        await jobs.announce(reply.id, owner=tenant, response=first, events=announced)
    except BaseException:
        await held.aclose()
        raise
    work = _run(jobs, reply, numbered, to.turns.run_at(tenant, place, to.turn), metrics, held)
    conversation_id = body.conversation_id or meta.id
    jobs.start(reply.id, linked("background response", work, turn_attributes(reply.id, conversation_id)))
    if body.stream:
        return EventStream(follow(jobs, tenant, reply.id, None))
    return JSONResponse(first)


async def _run(
    jobs: BackgroundJobs,
    reply: Reply,
    numbered: NumberedEvents,
    source: AsyncGenerator[Any, None],
    metrics: Metrics,
    held: contextlib.AsyncExitStack,
) -> None:
    """The turn, its events written to the job as they come; however it ends, the job says how."""
    events = timed(source, TokenTiming(metrics), lambda item: None)
    try:
        async with held:
            try:
                await anext(events)  # the turn holds its session
                reply.queued = False
                async for group in response_events(reply, events):
                    # response.created was announced when the job was made
                    batch = [numbered.number(p) for p in group if p["type"] != "response.created"]
                    state = any(event["type"] in STATE_EVENTS for event in batch)
                    response = reply.object().model_dump() if state else None
                    await jobs.write(reply.id, response=response, events=batch)
                    if jobs.asked_to_stop(reply.id) and reply.outcome is None:
                        raise asyncio.CancelledError  # however the task's own cancellation fared

            except asyncio.CancelledError:
                await _shielded(jobs, reply, numbered, None)
                raise
            except ServiceError as exc:
                await _shielded(jobs, reply, numbered, (exc.status, exc.body()["error"]))
            except Exception:
                log.exception("a background response failed")
                await _shielded(jobs, reply, numbered, (500, INTERNAL_ERROR))
    finally:
        with anyio.CancelScope(shield=True):
            await events.aclose()


async def _shielded(
    jobs: BackgroundJobs, reply: Reply, numbered: NumberedEvents, error: tuple[int, dict[str, Any]] | None
) -> None:
    """The job's end when the turn did not end by itself: failed with `error`, cancelled (nothing committed), or,
    if its step committed before the cancel, as it ended. Written to its end whatever cancels the job meanwhile."""

    async def write_end() -> None:
        events: list[Payload] = []
        if reply.outcome is not None:
            await reply.save()
        elif error is not None:
            events = numbered.failure(*error)
        elif jobs.stopping:  # the server stops: interrupted, as a replica that died would leave it
            events = numbered.failure(500, {"type": "internal", **INTERRUPTED})
        else:
            reply.cancelled = True
        await jobs.write(reply.id, response=reply.object().model_dump(), events=events)

    try:
        await to_the_end(write_end())
    except Exception:
        log.warning("could not write a background response's end", exc_info=True)


async def follow(
    jobs: BackgroundJobs, owner: str, response_id: str, after: int | None
) -> AsyncGenerator[str, None]:
    """The job's events after sequence number `after` (all of them with None), then those still to come, until
    it ends; then `[DONE]`."""
    cursor = 0 if after is None else after + 1
    while True:
        for event in await jobs.events(response_id, cursor):
            cursor += 1
            yield written(event)
        job = await jobs.find(owner, response_id)
        if job is None or job.finished:
            for event in await jobs.events(response_id, cursor):  # written with its end
                yield written(event)
            yield sse.DONE
            return
        await asyncio.sleep(FOLLOW_POLL_SECONDS)
