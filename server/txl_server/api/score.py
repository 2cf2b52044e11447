"""POST /v1/score: log-likelihood of a long document, as JSON or a `text/plain` body, optionally streamed; with
`memory`, given a preloaded memory's document first."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, Protocol

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import InvalidBody, InvalidRequest, ServiceError
from ..sessions.service import SessionService
from ..sessions.stateless import ScoreOutcome, StatelessService
from . import sse
from .common import (
    ERROR_RESPONSES,
    AppSettings,
    EventStream,
    ProgressThrottle,
    Service,
    Stateless,
    Tenant,
    progress_event,
    validation_message,
)
from .disconnect import WatchedRoute, watch_connection

router = APIRouter(tags=["scoring"], responses=ERROR_RESPONSES, route_class=WatchedRoute)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(..., description="The document")
    token_logprobs: bool = Field(False, description="Also return each token's log-probability and text")
    stream: bool = Field(False, description="Stream progress events, then the result")
    memory: str | None = Field(
        None, max_length=64, description="Score the text as if this preloaded memory's document came first"
    )


class ScoreResponse(BaseModel):
    object: Literal["score"] = "score"
    tokens: int
    bytes: int
    logprob: float = Field(..., description="Natural-log probability of the whole document")
    nll: float = Field(..., description="Mean negative log-likelihood per token (nats)")
    perplexity: float
    bits_per_byte: float
    token_logprobs: list[float] | None = None
    token_texts: list[str] | None = None


_BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            # Inline: the route reads its body itself, so FastAPI lists no ScoreRequest component to refer to.
            "application/json": {"schema": ScoreRequest.model_json_schema()},
            "text/plain": {"schema": {"type": "string"}},
        },
    }
}


@router.post(
    "/v1/score",
    response_model=ScoreResponse,
    openapi_extra=_BODY_DOC,
    responses={200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE events with stream"}},
)
@watch_connection
async def score(
    request: Request,
    tenant: Tenant,
    settings: AppSettings,
    stateless: Stateless,
    service: Service,
    token_logprobs: bool = Query(False, description="text/plain bodies: same as the JSON field"),
    stream: bool = Query(False, description="text/plain bodies: same as the JSON field"),
    memory: str | None = Query(None, max_length=64, description="text/plain bodies: same as the JSON field"),
) -> Any:
    body = await _read(
        request, settings.max_body_bytes, token_logprobs=token_logprobs, stream=stream, memory=memory
    )
    if not body.text:  # documents are limited by the body size (TXL_MAX_BODY_BYTES), not the prompt limit
        raise InvalidRequest("text to score is empty", param="text")
    scorer = _scorer(stateless, service, tenant, body.memory)
    tokenizer = stateless.tokenizer
    if not body.stream:
        outcome = await scorer(body.text, token_logprobs=body.token_logprobs)
        return _response(outcome, tokenizer, body.token_logprobs)
    return EventStream(_progress_stream(scorer, body, tokenizer))


class Scorer(Protocol):
    async def __call__(
        self, text: str, *, token_logprobs: bool = ..., progress: Callable[[int, int], None] | None = ...
    ) -> ScoreOutcome: ...


def _scorer(stateless: StatelessService, service: SessionService, tenant: str, memory: str | None) -> Scorer:
    """Scoring from nothing, or after a preloaded memory (the caller's own)."""
    if memory is None:
        return stateless.score
    return functools.partial(service.memories.score, tenant, memory)


async def _read(
    request: Request, limit: int, *, token_logprobs: bool, stream: bool, memory: str | None
) -> ScoreRequest:
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    raw = await request.body()
    if content_type == "text/plain":
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest("the body is not valid UTF-8", param="body") from exc
        return ScoreRequest(text=text, token_logprobs=token_logprobs, stream=stream, memory=memory)
    if content_type not in ("application/json", ""):
        raise InvalidRequest("send the document as application/json or text/plain", param="content-type")
    try:
        return ScoreRequest.model_validate_json(raw)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors()), content_type)
        raise InvalidBody(message, param=param or "body") from exc


def _response(outcome: ScoreOutcome, tokenizer: Any, with_tokens: bool) -> dict[str, Any]:
    return ScoreResponse(
        tokens=outcome.tokens,
        bytes=outcome.bytes,
        logprob=outcome.logprob,
        nll=outcome.nll,
        perplexity=outcome.perplexity,
        bits_per_byte=outcome.bits_per_byte,
        token_logprobs=outcome.token_logprobs if with_tokens else None,
        token_texts=[tokenizer.token_text(t) for t in outcome.token_ids] if with_tokens else None,
    ).model_dump(exclude_none=True)


async def _progress_stream(scorer: Scorer, body: ScoreRequest, tokenizer: Any) -> AsyncIterator[str]:
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    throttle = ProgressThrottle()

    def progress(done: int, total: int) -> None:
        if throttle.due(done, total):
            queue.put_nowait((done, total))

    task = asyncio.create_task(scorer(body.text, token_logprobs=body.token_logprobs, progress=progress))
    try:
        while not task.done() or not queue.empty():
            getter = asyncio.create_task(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                done, total = getter.result()
                yield progress_event(done, total)
            else:
                getter.cancel()
        outcome = task.result()
        yield sse.event({"type": "result", **_response(outcome, tokenizer, body.token_logprobs)})
    except ServiceError as exc:
        yield sse.event({"type": "error", **exc.body()})
    finally:
        if not task.done():
            task.cancel()  # the client went away: stop scoring
            with contextlib.suppress(BaseException):
                await task
    yield sse.DONE
