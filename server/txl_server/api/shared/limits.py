"""The limits on what a request may carry, each set here once: text, stop strings, metadata, the number of
tokens to generate, the seed, and the lengths of names. Limits the operator sets (`Settings`) are checked by these
functions, and the fields they bound carry them into the OpenAPI document (`operator_limit`); fixed bounds are in
the types the schemas' fields use (`MaxTokens`, `Seed`, `StopStrings`)."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from ...errors import InvalidRequest, PayloadTooLarge
from ...limits import check_max_tokens
from ...settings import Settings

# In a field's JSON schema: JSON Schema keywords whose values are the operator's settings, e.g.
# {"maximum": "max_tokens"}. The served OpenAPI document puts the settings' values there (api/openapi_document.py).
OPERATOR_LIMIT = "x-txl-limit"


def operator_limit(**keywords: str) -> dict[str, Any]:
    """`json_schema_extra` of a field bounded by the operator: JSON Schema keyword -> `Settings` attribute."""
    return {OPERATOR_LIMIT: keywords}


# Every count of tokens to generate (`max_tokens`, `max_output_tokens`, ...): the most is the operator's
# (`check_max_tokens`).
MaxTokens = Annotated[int, Field(ge=0, json_schema_extra=operator_limit(maximum="max_tokens"))]


def _not_a_boolean(value: Any) -> Any:
    """`true` is not a token id (pydantic's lax mode reads it as 1; shared/request_body.py does this for fields)."""
    if isinstance(value, bool):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


# A prompt as token ids (`check_token_ids`): below the model's vocabulary size, as many as a text may have characters.
TokenId = Annotated[int, Field(ge=0), BeforeValidator(_not_a_boolean)]
TokenIds = Annotated[list[TokenId], Field(json_schema_extra=operator_limit(maxItems="max_text_chars"))]
# Text a request feeds the model (`check_text`).
Text = Annotated[str, Field(json_schema_extra=operator_limit(maxLength="max_text_chars"))]
StopString = Annotated[str, Field(min_length=1, json_schema_extra=operator_limit(maxLength="max_stop_chars"))]
# Generation ends before the first of these (`check_stop`).
StopStrings = (
    StopString
    | Annotated[list[StopString], Field(json_schema_extra=operator_limit(maxItems="max_stop_strings"))]
    | None
)
# A lifetime in seconds: at most the operator's (TXL_MAX_TTL_SECONDS; sessions/service.py checks it).
TtlSeconds = Annotated[int, Field(ge=1, json_schema_extra=operator_limit(maximum="max_ttl_seconds"))]
# At most the largest integer every JSON reader reads exactly (a double's 53 bits; JavaScript's MAX_SAFE_INTEGER).
Seed = Annotated[int, Field(ge=0, le=2**53 - 1)]
MAX_MEMORY_ID_CHARS = 64  # the longest preloaded memory's id a request may name
MAX_USER_CHARS = 256  # OpenAI's `user`: the caller's label for its own user


def check_unicode(text: str, param: str) -> None:
    """JSON can carry lone surrogates (`"\\ud800"`), which are not text: refuse them before they go anywhere."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{param} is not valid Unicode (a lone surrogate)", param=param) from None


def check_text(settings: Settings, text: str, param: str) -> None:
    if len(text) > settings.max_text_chars:
        raise PayloadTooLarge(f"{param} is longer than {settings.max_text_chars} characters", param=param)
    check_unicode(text, param)


def check_token_ids(settings: Settings, ids: list[int], vocab_size: int, param: str) -> None:
    """Token ids a request feeds the model: each in the vocabulary, and as many as a text may have characters."""
    if any(not 0 <= t < vocab_size for t in ids):
        raise InvalidRequest(f"token ids must be in [0, {vocab_size})", param=param)
    if len(ids) > settings.max_text_chars:
        raise PayloadTooLarge(f"{param} has more than {settings.max_text_chars} tokens", param=param)


def check_stop(settings: Settings, stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > settings.max_stop_strings:
        raise InvalidRequest(f"at most {settings.max_stop_strings} stop strings", param="stop")
    for s in stops:
        if not s or len(s) > settings.max_stop_chars:
            raise InvalidRequest(
                f"stop strings must have 1 to {settings.max_stop_chars} characters", param="stop"
            )
    return stops


def check_metadata(settings: Settings, metadata: dict[str, Any] | None, *, max_depth: int = 4) -> None:
    if metadata is None:
        return

    def depth(value: Any) -> int:
        if isinstance(value, str):
            check_unicode(value, "metadata")
        if isinstance(value, dict):
            for key in value:
                check_unicode(key, "metadata")
            return 1 + max((depth(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return 1 + max((depth(v) for v in value), default=0)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest("metadata numbers must be finite", param="metadata")
        return 0

    if depth(metadata) > max_depth:
        raise InvalidRequest(f"metadata may nest at most {max_depth} levels", param="metadata")
    if len(json.dumps(metadata).encode()) > settings.max_metadata_bytes:
        raise InvalidRequest(
            f"metadata is larger than {settings.max_metadata_bytes} bytes as JSON", param="metadata"
        )


def max_tokens_of(settings: Settings, given: int | None, default: int, param: str = "max_tokens") -> int:
    """The most tokens a request generates: as `given` (checked), else the route's `default`, lowered to the
    operator's most (a request that leaves it out is never refused for it)."""
    if given is None:
        return min(default, settings.max_tokens)
    check_max_tokens(settings, given, param)
    return given
