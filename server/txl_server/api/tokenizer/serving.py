"""Text <-> token ids with the served model's tokenizer, and its description: exactly what the completions routes
do with a prompt (the same encoding, the same limits), so that a client can count and build token-form prompts."""

from __future__ import annotations

from typing import Any

from txl.tokenizers import Tokenizer
from txl.tokenizers.hf_export import tokenizer_config

from ...errors import InvalidRequest
from ...settings import Settings
from ..shared.chat_template import ChatTemplate
from ..shared.limits import check_text, check_token_ids
from ..shared.openai_errors import ModelNotFound
from .protocol import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse


def _check_model(model: str | None, model_id: str) -> None:
    if model is not None and model != model_id:
        raise ModelNotFound(model, model_id)


def tokenize(
    body: TokenizeRequest, tokenizer: Tokenizer, settings: Settings, model_id: str
) -> TokenizeResponse:
    _check_model(body.model, model_id)
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequest("give prompt or messages (one of them)", param="prompt")
    if body.messages is not None:
        if settings.chat_template is None:
            raise InvalidRequest(
                "this server has no chat template (TXL_CHAT_TEMPLATE): send the text as prompt",
                param="messages",
            )
        template = ChatTemplate(settings.chat_template)
        text = template.prompt(body.messages, generation_prompt=body.add_generation_prompt)
    else:
        assert body.prompt is not None
        text = body.prompt
    check_text(settings, text, "prompt")
    ids = tokenizer.encode(text)
    strs = [tokenizer.token_text(t) for t in ids] if body.return_token_strs else None
    return TokenizeResponse(
        count=len(ids), max_model_len=settings.max_text_chars, tokens=ids, token_strs=strs
    )


def detokenize(
    body: DetokenizeRequest, tokenizer: Tokenizer, settings: Settings, model_id: str
) -> DetokenizeResponse:
    """The text of the ids, as the completions routes write it (a byte that ends no whole character is U+FFFD)."""
    _check_model(body.model, model_id)
    check_token_ids(settings, body.tokens, tokenizer.vocab_size, "tokens")
    return DetokenizeResponse(prompt=tokenizer.decode(body.tokens))


def tokenizer_info(tokenizer: Tokenizer, start_id: int, settings: Settings) -> dict[str, Any]:
    template = ChatTemplate(settings.chat_template).jinja() if settings.chat_template is not None else None
    info = tokenizer_config(tokenizer, model_max_length=settings.max_text_chars, chat_template=template)
    # The token every text starts from (sessions/prefix_cache.py): what lm-eval puts before a document.
    info["bos_token"] = tokenizer.token_text(start_id)
    return info
