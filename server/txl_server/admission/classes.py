"""A request's class: whose it is (its tenant, for fair share) and how it is served (its lane, and its rank within
its tenant's work).

The API layer makes one per request (the tenant from the key, the tier from the body's `service_tier`; batch for
background responses and long scoring) and passes it down, as a value, to the jobs the request makes
(`engine.jobs`: `klass`), by which the worker admits and schedules them. A request may make several jobs (a
prompt's prefill, then its generation; `n` choices): they share its class, and admission judges the request once,
at its first job (`admitted`).

Work of the server's own (start-up checks, benchmarks, tests that drive the worker directly) has no class: it is
served as interactive work and never refused for its latency.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum


class ServiceTier(StrEnum):
    """OpenAI's `service_tier`."""

    AUTO = "auto"  # the server chooses: default
    DEFAULT = "default"
    FLEX = "flex"  # cheaper and slower: what interactive work leaves, refused first, paused when it needs the room
    PRIORITY = "priority"  # ahead of its tenant's default work, refused last


class Lane(IntEnum):
    """The order in which the scheduler serves work: a lower lane always first."""

    INTERACTIVE = 0  # priority and default: first tokens within the target
    FLEX = 1  # service_tier flex
    BATCH = 2  # background responses and long scoring: never delay an interactive first token


# A class's name in metrics and logs.
PRIORITY, DEFAULT, FLEX, BATCH = "priority", "default", "flex", "batch"
CLASSES = (PRIORITY, DEFAULT, FLEX, BATCH)
SERVER = ""  # the tenant of the server's own work


def served_tier(requested: str | None) -> ServiceTier:
    """The tier a request is served in (and which the response echoes, as OpenAI's does): `auto` and none are
    `default`."""
    if requested is None or requested == ServiceTier.AUTO:
        return ServiceTier.DEFAULT
    return ServiceTier(requested)


@dataclass(eq=False)
class RequestClass:
    """One request's class, shared by the jobs it makes. Admission judges a request once, at its first job: the
    later ones continue work already admitted (`admitted`)."""

    tenant: str = SERVER
    tier: ServiceTier = ServiceTier.DEFAULT
    batch: bool = False  # background responses, long scoring
    # What the request decodes once its input is fed, when its first job only feeds it (a stateless completion's
    # prompt goes through the prefix cache first): rows and tokens, for the estimate of its first token.
    decode_rows: int = 0
    decode_tokens: int = 0
    admitted: bool = False
    # For the estimate's own check (policy.AdmissionPolicy.learn): when the request began (time.monotonic()), when
    # admission expected its first token, and when it came.
    created_at: float = field(default_factory=time.monotonic)
    expected_at: float | None = None
    first_token_at: float | None = None

    @property
    def lane(self) -> Lane:
        if self.batch:
            return Lane.BATCH
        return Lane.FLEX if self.tier is ServiceTier.FLEX else Lane.INTERACTIVE

    @property
    def rank(self) -> int:
        """Its order among its tenant's work of the same lane: priority first."""
        return 0 if self.tier is ServiceTier.PRIORITY else 1

    @property
    def name(self) -> str:
        """Its name in metrics: priority, default, flex or batch."""
        if self.batch:
            return BATCH
        return {ServiceTier.PRIORITY: PRIORITY, ServiceTier.FLEX: FLEX}.get(self.tier, DEFAULT)


def request_class(tenant: str, service_tier: str | None = None, *, batch: bool = False) -> RequestClass:
    """The class of a request of `tenant` that asked for `service_tier`."""
    return RequestClass(tenant, served_tier(service_tier), batch=batch)
