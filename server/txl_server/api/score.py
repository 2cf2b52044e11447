"""POST /v1/score: log-likelihood of a long document, as JSON or a `text/plain` body, optionally streamed."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import InvalidBody, InvalidRequest
from ..sessions.stateless import ScoreOutcome
from .common import ERROR_RESPONSES, AppSettings, Service, Stateless, Tenant, validation_message
from .disconnect import WatchedRoute, watch_connection
from .json_body import utf8_error
from .progress import Progress, long_work, streamed_responses

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
    cached_tokens: int = Field(
        0, description="Tokens whose scores came from the prefix cache (the same numbers)"
    )


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
    "/v1/score", response_model=ScoreResponse, openapi_extra=_BODY_DOC, responses=streamed_responses(200)
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

    async def scored(progress: Progress | None) -> dict[str, Any]:
        if body.memory is not None:  # after a preloaded memory of the caller's
            outcome = await service.memories.score(
                tenant, body.memory, body.text, token_logprobs=body.token_logprobs, progress=progress
            )
        else:
            outcome = await stateless.score(
                body.text, owner=tenant, token_logprobs=body.token_logprobs, progress=progress
            )
        return _response(outcome, stateless.tokenizer, body.token_logprobs)

    return await long_work(scored, stream=body.stream)


async def _read(
    request: Request, limit: int, *, token_logprobs: bool, stream: bool, memory: str | None
) -> ScoreRequest:
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    raw = await request.body()
    if content_type not in ("text/plain", "application/json", ""):
        raise InvalidRequest("send the document as application/json or text/plain", param="content-type")
    if (error := utf8_error(raw, json_body=content_type != "text/plain")) is not None:
        raise error
    if content_type == "text/plain":
        text = raw.decode("utf-8")
        return ScoreRequest(text=text, token_logprobs=token_logprobs, stream=stream, memory=memory)
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
        cached_tokens=outcome.cached_tokens,
    ).model_dump(exclude_none=True)
