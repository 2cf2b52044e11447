"""User text in the logs, only where the operator opted in."""

from __future__ import annotations

import logging

from ...settings import Settings

_text_log = logging.getLogger("txl_server.text")


def log_text(settings: Settings, what: str, text: str) -> None:
    """User text reaches the logs only when the operator opted in (TXL_LOG_PROMPTS=true)."""
    if settings.log_prompts:
        _text_log.info("%s: %r", what, text)
