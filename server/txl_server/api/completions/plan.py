"""A completion request checked against what this server supports and its limits: its prompts as token ids, one
set of sampling parameters per choice, the stop strings, and what to report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txl.sampling import SamplingParams
from txl.tokenizers import Tokenizer

from ...errors import InvalidRequest
from ...settings import Settings
from ..shared.limits import check_stop, check_text, check_token_ids, max_tokens_of
from ..shared.openai_errors import ModelNotFound
from .protocol import DEFAULT_MAX_TOKENS, MAX_CHOICES, CompletionRequest


@dataclass(frozen=True)
class Plan:
    """The validated request: prompts as token ids, sampling, and what to report."""

    prompts: list[tuple[str, list[int]]]  # (text, token ids) of each prompt
    n: int  # choices per prompt
    sampling: list[SamplingParams]  # of each choice
    stops: list[str]
    max_tokens: int
    top: int  # log-probs of the likeliest alternatives to report per token
    tokenizer: Tokenizer

    @classmethod
    def build(
        cls,
        body: CompletionRequest,
        model_id: str,
        tokenizer: Tokenizer,
        settings: Settings,
        *,
        turn_end: str | None = None,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> Plan:
        """The plan of `body`; `turn_end`: a stop string of the server's own (a chat template's), on top of the
        request's (not counted against its limits); `default_max_tokens`: the route's, when `max_tokens` is not
        given."""
        if body.model is not None and body.model != model_id:
            raise ModelNotFound(body.model, model_id)
        if body.suffix:
            raise InvalidRequest("suffix is not supported", param="suffix")
        if body.best_of not in (None, body.n or 1):
            raise InvalidRequest("best_of other than n is not supported", param="best_of")
        for penalty in ("frequency_penalty", "presence_penalty"):
            if getattr(body, penalty):
                raise InvalidRequest(f"{penalty} is not supported (only 0)", param=penalty)
        prompts = cls._prompts(body.prompt, tokenizer, settings)
        if body.session_id is not None and body.memory is not None:
            raise InvalidRequest("give session_id or memory, not both", param="memory")
        if body.session_id is not None and len(prompts) != 1:
            raise InvalidRequest("with session_id, give a single prompt", param="prompt")
        sent = body.max_tokens if "max_tokens" in body.model_fields_set else None
        max_tokens = max_tokens_of(settings, sent, default_max_tokens)
        n = body.n or 1
        if body.session_id is not None and n != 1:
            raise InvalidRequest("with session_id, n must be 1", param="n")
        if len(prompts) * n > MAX_CHOICES:
            # With one choice each, the prompts are too many; else the choices per prompt.
            param = "prompt" if n == 1 else "n"
            raise InvalidRequest(f"prompts x n must be at most {MAX_CHOICES}", param=param)
        return cls(
            prompts,
            n,
            body.to_sampling_params(),
            check_stop(settings, body.stop) + ([turn_end] if turn_end else []),
            max_tokens,
            body.logprobs or 0,
            tokenizer,
        )

    @staticmethod
    def _prompts(prompt: Any, tokenizer: Tokenizer, settings: Settings) -> list[tuple[str, list[int]]]:
        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            items = [prompt]
        else:
            items = list(prompt) or [""]
        out = []
        for item in items:
            if isinstance(item, str):
                check_text(settings, item, "prompt")
                out.append((item, tokenizer.encode(item)))
            else:
                check_token_ids(settings, item, tokenizer.vocab_size, "prompt")
                out.append((tokenizer.decode(item), list(item)))
        return out
