"""OpenAI's chat `logprobs` (`{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`), from the
completion's (`{"tokens", "token_logprobs", "top_logprobs", ...}`, completions/logprobs.py)."""

from __future__ import annotations

from typing import Any

from ..completions.protocol import CompletionLogprobs
from .protocol import ChoiceLogprobs, TokenLogprob, TopLogprob

UNLIKELY = -9999.0


def chat_logprobs(logprobs: CompletionLogprobs | dict[str, Any] | None, top: int) -> ChoiceLogprobs | None:
    """A choice's (or a streamed chunk's) chat log-probs: per token, its own and the `top` likeliest tokens at its
    position (the completion's alternatives may also hold the chosen token: OpenAI's chat lists exactly `top`)."""
    if logprobs is None:
        return None
    given = CompletionLogprobs.model_validate(logprobs)
    alternatives = given.top_logprobs or [None] * len(given.tokens)
    content = []
    for token, logprob, others in zip(given.tokens, given.token_logprobs, alternatives, strict=True):
        likeliest = sorted((others or {}).items(), key=lambda item: -item[1])[:top]
        content.append(
            TokenLogprob(
                **_entry(token, logprob),
                top_logprobs=[TopLogprob(**_entry(text, value)) for text, value in likeliest],
            )
        )
    return ChoiceLogprobs(content=content)


def _entry(token: str, logprob: float | None) -> dict[str, Any]:
    # OpenAI's convention: -9999.0 for a token too unlikely to say (-inf is not JSON).
    value = UNLIKELY if logprob is None else max(logprob, UNLIKELY)
    return {"token": token, "logprob": value, "bytes": list(token.encode("utf-8", "replace"))}
