"""What session operations yield while they run: the routes' view of the engine's events."""

from __future__ import annotations

from ..engine.jobs import GenerateResult, ProgressEvent, TokenEvent
from ..engine.rows import TopLogprobs

__all__ = ["GenerateResult", "ProgressEvent", "TokenEvent", "TopLogprobs"]
