"""Scoring a long document: its body read as JSON or plain text, and the log-likelihood of its text (after a
preloaded memory's document, with `memory`), as one JSON answer or a stream of progress."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import ValidationError
from txl.tokenizers import Tokenizer

from ...admission.classes import request_class
from ...errors import InvalidBody, InvalidRequest
from ...sessions.service import SessionService
from ...sessions.stateless import ScoreOutcome, StatelessService
from ..shared.json_body import utf8_error
from ..shared.progress import Progress, long_work
from ..shared.validation import validation_message, validation_status
from .protocol import ScoreRequest, ScoreResponse

# A document longer than this is batch work (admission.classes): its segments take only what streams leave, and
# never delay an interactive first token. Shorter ones are scored as interactive requests. (4,096 characters: a
# few segments of a byte-level model, some hundreds of words.)
LONG_DOCUMENT_CHARS = 4096


async def read(
    request: Request, limit: int, *, token_logprobs: bool, stream: bool, memory: str | None
) -> ScoreRequest:
    """The request from its body: JSON, or the document as `text/plain` (its options then in the query)."""
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    raw = await request.body()
    if content_type not in ("text/plain", "application/json", ""):
        raise InvalidRequest("send the document as application/json or text/plain", param="content-type")
    if (error := utf8_error(raw, json_body=content_type != "text/plain")) is not None:
        raise error
    try:
        if content_type == "text/plain":
            options = {"token_logprobs": token_logprobs, "stream": stream, "memory": memory}
            return ScoreRequest.model_validate({"text": raw.decode("utf-8"), **options})
        return ScoreRequest.model_validate_json(raw)
    except ValidationError as exc:
        errors = list(exc.errors())
        message, param = validation_message(errors, content_type)
        refused = InvalidBody if validation_status(errors) == InvalidBody.status else InvalidRequest
        raise refused(message, param=param or "body") from exc


async def score(body: ScoreRequest, tenant: str, stateless: StatelessService, service: SessionService) -> Any:
    klass = request_class(tenant, batch=len(body.text) > LONG_DOCUMENT_CHARS)

    async def scored(progress: Progress | None) -> dict[str, Any]:
        if body.memory is not None:  # after a preloaded memory of the caller's
            outcome = await service.memories.score(
                tenant,
                body.memory,
                body.text,
                token_logprobs=body.token_logprobs,
                progress=progress,
                klass=klass,
            )
        else:
            outcome = await stateless.score(
                body.text, owner=tenant, token_logprobs=body.token_logprobs, progress=progress, klass=klass
            )
        return _response(outcome, stateless.tokenizer, body.token_logprobs)

    return await long_work(scored, stream=body.stream)


def _response(outcome: ScoreOutcome, tokenizer: Tokenizer, with_tokens: bool) -> dict[str, Any]:
    response = ScoreResponse.model_validate(outcome, from_attributes=True)
    if with_tokens:
        response.token_texts = [tokenizer.token_text(t) for t in outcome.token_ids]
    else:
        response.token_logprobs = None
    return response.model_dump(exclude_none=True)
