"""What vLLM's tokenizer routes take and return, in vLLM's JSON (pydantic, at the edge only), so that tools written
for vLLM (lm-evaluation-harness' `tokenizer_backend=remote`) work unchanged."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from ..shared.chat_template import ChatMessage
from ..shared.limits import Text, TokenIds
from ..shared.request_body import RequestBody


class TokenizeRequest(RequestBody):
    """A text (`prompt`), or a chat (`messages`) written out with the server's chat template."""

    # Unknown fields are ignored, as vLLM's clients send options this server has no use for.
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: Text | None = Field(None, description="The text (give prompt or messages)")
    messages: list[ChatMessage] | None = Field(
        None,
        min_length=1,
        description="A chat, written out with the server's chat template (TXL_CHAT_TEMPLATE)",
    )
    add_generation_prompt: StrictBool = Field(
        True, description="With messages: end with the assistant's prefix"
    )
    add_special_tokens: StrictBool = Field(
        True,
        description="Accepted for vLLM's clients; adds nothing: the server puts its start token (bos_token) "
        "before every text itself, and the tokens returned are the prompt's, as completions count them",
    )
    return_token_strs: StrictBool = Field(False, description="Also return each token's text")


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int = Field(..., description="The most tokens a prompt may have (TXL_MAX_TEXT_CHARS)")
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(RequestBody):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: TokenIds


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfo(BaseModel):
    """The tokenizer's HF `tokenizer_config.json` (the one `txl tokenizer export` writes), as vLLM answers it;
    `bos_token` is the token the server starts every text from."""

    model_config = ConfigDict(extra="allow")
    tokenizer_class: str
    model_max_length: int
    eos_token: str | None
    bos_token: str | None
    pad_token: str | None
    unk_token: str | None
    chat_template: str | None = None
