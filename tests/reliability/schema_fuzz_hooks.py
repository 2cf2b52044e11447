"""schemathesis hooks of the fuzzing test (`SCHEMATHESIS_HOOKS`): schemathesis' `positive_data_acceptance`, but for
the few refusals of a schema-valid request that a schema cannot express, each listed with its reason.

A refusal is allowed when its status, its error's code (else its type) and its `param` match an entry: anything
else the document calls valid must be accepted (or be a 401, 404, 409 or 429, as schemathesis allows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import positive_data_acceptance


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str  # the error's code, else its type
    param: str | None
    reason: str


ALLOWED = (
    Refusal(
        422,
        "idempotency_key_reused",
        "Idempotency-Key",
        "a key sent again with another body: the server remembers the first body, the schema cannot",
    ),
    Refusal(
        400,
        "previous_response_not_found",
        "previous_response_id",
        "an id that names no stored response: which ids exist is the server's state, not the schema's",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "after",
        "GET /v1/responses/{id}/input_items: an `after` naming no item of the response: the server's state",
    ),
    Refusal(
        400,
        "invalid_request",
        "body",
        "POST /v1/sessions/import: bytes that are not a snapshot of this model; the schema says binary",
    ),
    Refusal(
        400,
        "invalid_request",
        "mem_len",
        "a mem_len above the model's: the document is made without the model (docs/openapi.json)",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "prompt",
        "token ids at or above the model's vocabulary size, which the document does not know",
    ),
    Refusal(
        400,
        "invalid_request",
        "metadata",
        "metadata over TXL_MAX_METADATA_BYTES as JSON: a size in bytes of JSON, which a schema cannot state",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "memory",
        "/v1/completions with both session_id and memory: two fields each valid alone",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "n",
        "/v1/completions: prompts x n over 64, or n > 1 with session_id: a bound on two fields together",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "best_of",
        "/v1/completions: best_of other than n (no server-side best-of): equal to another field",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "tokens",
        "POST /detokenize: token ids at or above the model's vocabulary size, which the document does not know",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "prompt",
        "POST /tokenize: prompt and messages both, or neither: one of two fields, each optional alone",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "messages",
        "POST /tokenize: messages on a server without a chat template (TXL_CHAT_TEMPLATE): a setting",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "top_logprobs",
        "/v1/chat/completions: top_logprobs without logprobs: true, which OpenAI refuses too",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "metadata",
        "Responses and Conversations: metadata over TXL_MAX_METADATA_BYTES as JSON, which a schema cannot state",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "conversation",
        "/v1/responses with both conversation and previous_response_id: each valid alone, refused together as "
        "OpenAI refuses them",
    ),
    Refusal(
        400,
        "context_length_exceeded",
        "truncation",
        "/v1/responses with truncation disabled: whether the context fits the memory's window depends on the "
        "session's length, the server's state",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "stream",
        "GET /v1/responses/{id}?stream=true of a response not made in the background: its kind is the server's state",
    ),
    Refusal(
        400,
        "invalid_request_error",
        "response_id",
        "POST /v1/responses/{id}/cancel of a response not made in the background: its kind is the server's state",
    ),
)


def allowed(status: int, error: dict) -> Refusal | None:
    code = error.get("code") or error.get("type")
    for refusal in ALLOWED:
        if (refusal.status, refusal.code, refusal.param) == (status, code, error.get("param")):
            return refusal
    return None


@schemathesis.check
def schema_valid_requests_are_accepted(ctx, response, case):
    """`positive_data_acceptance`, but for the refusals in ALLOWED."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        try:
            error = json.loads(response.content)["error"]
        except (ValueError, KeyError, TypeError):
            raise
        if allowed(response.status_code, error) is None:
            raise
        return None
