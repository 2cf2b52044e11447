"""`Idempotency-Key`: a retried request returns the first one's result instead of doing the work again.

Create, delete, fork, import, append and generate take the header. A key belongs to the tenant, the method and the path
(`POST /v1/sessions/{id}/append`), and remembers a fingerprint of the request's body. While the first request
runs, a retry gets 409; once it has finished, a retry gets its response; if it failed, the key is released and a
retry runs anew. The claim of a running request lasts a lease (`TXL_LEASE_TTL_SECONDS`) and is renewed while it
runs: if its process dies (`kill -9`, a lost node), the claim lapses and a retry, on any replica, runs anew. A key
reused with a different body is refused with 422 `idempotency_key_reused` (as the IETF Idempotency-Key draft and
Stripe do): replaying the first result would answer a question nobody asked.

Routes take the `Idempotent` dependency (the request's call, sessions/idempotency.py: the claim, the replay and
the record) and run their work through it:

    return await idempotent.run(lambda: service.append(...))
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import Depends, Header, Request

from ...sessions.idempotency import IdempotentCall
from .dependencies import AppSettings, Service, Tenant

# What a key may be: the header's `pattern` in the OpenAPI document, checked with the request's other fields (422).
KEY_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
# Fields that change how a result is delivered, not what is done: a streamed retry of a JSON request replays it.
_DELIVERY_FIELDS = ("stream",)


def fingerprint(body: bytes, query: str) -> str:
    """SHA-256 of the request as the server reads it: JSON with sorted keys (so spacing and key order do not
    matter), without the delivery fields (in the body or the query); any other body (a snapshot) as the
    SHA-256 of its bytes."""
    try:
        value = json.loads(body) if body else None
    except (ValueError, RecursionError):
        value = ["sha256", hashlib.sha256(body).hexdigest()]
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in _DELIVERY_FIELDS}
    parameters = sorted(p for p in parse_qsl(query, keep_blank_values=True) if p[0] not in _DELIVERY_FIELDS)
    canonical = json.dumps(
        [parameters, value], sort_keys=True, separators=(",", ":")
    )  # ASCII: lone surrogates too
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


async def idempotent_call(
    request: Request,
    service: Service,
    tenant: Tenant,
    settings: AppSettings,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            pattern=KEY_PATTERN,
            description="Retries with this key return the first request's result (1-128 of [A-Za-z0-9._:-])",
        ),
    ] = None,
) -> IdempotentCall:
    scope = f"{request.method} {request.url.path}"
    return IdempotentCall(
        service.idempotency,
        owner=tenant,
        scope=scope,
        key=idempotency_key,
        fingerprint=fingerprint(await request.body(), request.url.query) if idempotency_key else "",
        ttl=settings.idempotency_ttl_seconds,
        claim_ttl=max(1, math.ceil(settings.lease_ttl_seconds)),
    )


Idempotent = Annotated[IdempotentCall, Depends(idempotent_call)]
