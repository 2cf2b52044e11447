"""What the session service is asked and answers: a new session's request, and a step's outcome."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from ..admission.classes import RequestClass
from ..engine.jobs import GenerateResult
from .step import Progress, ReceiptOf
from .store.sessions import SessionMeta


@dataclass(frozen=True)
class AppendOutcome:
    session: SessionMeta
    tokens: int
    logprob: float


@dataclass(frozen=True, kw_only=True)
class NewSession:
    """What a new session is asked to hold and be (`create`'s arguments), whichever way it is made."""

    text: str = ""
    mem_len: int | None = None
    ttl_seconds: int | None = None
    metadata: dict[str, Any] | None = None
    progress: Progress | None = None
    receipt: ReceiptOf | None = None
    klass: RequestClass | None = None


@dataclass(frozen=True)
class GenerateOutcome:
    session: SessionMeta
    result: GenerateResult


def new_session_id() -> str:
    """32 URL-safe characters holding ~192 random bits. Never starting with '-': command lines (ours included)
    would read such an id as an option, so those draws are discarded (which costs 0.02 bits); nor with `mem_`,
    which names preloaded memories (store/memories.py)."""
    while True:
        candidate = secrets.token_urlsafe(24)
        if not candidate.startswith(("-", "mem_")):
            return candidate
