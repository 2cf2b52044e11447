"""The operator's limits that more than one layer checks: the rule lives here once, and each caller names the
field it reads (`max_tokens`, `max_output_tokens`, ...). The HTTP layer checks a request before any work starts;
the session service checks the same rule for callers that are not the HTTP layer (benchmarks, embedders)."""

from __future__ import annotations

from .errors import InvalidRequest
from .settings import Settings


def check_max_tokens(settings: Settings, max_tokens: int, param: str = "max_tokens") -> None:
    """The most tokens one request may generate (TXL_MAX_TOKENS), whatever the field is called; never below 0."""
    if max_tokens < 0:
        raise InvalidRequest(f"{param} must be at least 0", param=param)
    if max_tokens > settings.max_tokens:
        raise InvalidRequest(f"{param} must be at most {settings.max_tokens}", param=param)
