"""What `POST /v1/score` takes (a JSON body, or a `text/plain` one with query parameters) and returns."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from ..shared.limits import MAX_MEMORY_ID_CHARS


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Documents are limited by the body size (TXL_MAX_BODY_BYTES), not the prompt limit.
    text: str = Field(..., min_length=1, description="The document")
    token_logprobs: StrictBool = Field(False, description="Also return each token's log-probability and text")
    stream: StrictBool = Field(False, description="Stream progress events, then the result")
    memory: str | None = Field(
        None,
        max_length=MAX_MEMORY_ID_CHARS,
        description="Score the text as if this preloaded memory's document came first",
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


# For the route's `openapi_extra`: both bodies it reads.
SCORE_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            # Inline: the route reads its body itself, so FastAPI lists no ScoreRequest component to refer to.
            "application/json": {"schema": ScoreRequest.model_json_schema()},
            "text/plain": {"schema": {"type": "string", "minLength": 1}},
        },
    }
}
