"""What one API call sends: method, path, body and headers, with the Idempotency-Key its retries reuse and the
session header a router reads. The operations (operations.py, memories.py) build them; the transports send them.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Call:
    """One logical API call. Its retries send the very same request, Idempotency-Key included, so a retry after
    a lost response cannot change anything twice: reads and scoring change nothing, and everything else is keyed
    (create, delete, fork, append, generate)."""

    method: str
    path: str
    body: dict[str, Any] | None = None  # sent as JSON
    idempotency_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None  # sent as it is (a snapshot), instead of a JSON body
    params: dict[str, str] = field(default_factory=dict)
    changes_nothing: bool = False  # a POST that only reads (scoring): as safe to send again as a GET

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.idempotency_key is not None:
            headers["Idempotency-Key"] = self.idempotency_key
        session = routed_session(self.path, self.body)
        if session is not None:
            headers[SESSION_HEADER] = session
        return headers

    @property
    def repeatable(self) -> bool:
        """Whether sending it again can never change anything twice: reads, and keyed steps."""
        return self.method in ("GET", "HEAD") or self.changes_nothing or self.idempotency_key is not None


# ---------------------------------------------------------------------------------------------- routing

# A router in front of several replicas keeps a session on one of them by its id: nginx hashes the id in the path,
# or this header for a request that names its session only in the body (deploy/nginx/session-map.conf); an endpoint
# picker, which does not parse paths, reads the header for every session request (deploy/k8s/inference-pool).
# docs/deploy.md, "What a router needs".
SESSION_HEADER = "X-TXL-Session"
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SESSION_PATH = re.compile(r"/v1/sessions/([A-Za-z0-9_-]{1,64})(?:/|$)")
# A response id (/v1/responses) is "resp_" followed by its session's 32-character id, then the response's own part.
_RESPONSE_ID = re.compile(r"resp_([A-Za-z0-9_-]{32})")
# A conversation id is "conv_" followed by the 32-character id of the session it lives on.
_CONVERSATION_ID = re.compile(r"conv_([A-Za-z0-9_-]{32})$")


def routed_session(path: str, body: dict[str, Any] | None) -> str | None:
    """The session a request works on: the id in its path (/v1/sessions/{id}/...), else the body's `session_id`
    (/v1/completions), else the session of its `previous_response_id` or `conversation` (/v1/responses); None for
    no session."""
    if m := _SESSION_PATH.match(path):
        return m.group(1)
    if not body:
        return None
    session = body.get("session_id")
    if isinstance(session, str) and _SESSION_ID.fullmatch(session):
        return session
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and (m := _RESPONSE_ID.match(previous)):
        return m.group(1)
    conversation = body.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    if isinstance(conversation, str) and (m := _CONVERSATION_ID.match(conversation)):
        return m.group(1)
    return None


# ---------------------------------------------------------------------------------------------- builders


def new_idempotency_key() -> str:
    return "txl-" + uuid.uuid4().hex


def keyed_call(method: str, path: str, body: dict[str, Any] | None, idempotency_key: str | None) -> Call:
    """A call that changes something, keyed (with `idempotency_key`, else a fresh key): its retries, and a retry
    after a lost response, return the first attempt's result instead of doing the work twice."""
    return Call(method, path, body, idempotency_key=idempotency_key or new_idempotency_key())


def session_call(method: str, session_id: str, suffix: str = "") -> Call:
    return Call(method, session_path(session_id) + suffix)


def step_call(session_id: str, op: str, body: dict[str, Any] | None, idempotency_key: str | None) -> Call:
    """append, generate, fork, rewind: always keyed, so that a retry never advances the session twice."""
    return keyed_call("POST", f"{session_path(session_id)}/{op}", body, idempotency_key)


def session_path(session_id: str) -> str:
    return "/v1/sessions/" + path_segment(session_id, "session")


def path_segment(value: str, what: str) -> str:
    """An id as one segment of a path: never empty, "." or "..", nor holding a "/"."""
    if not value or "/" in value or value in (".", ".."):
        raise ValueError(f"not a {what} id: {value!r}")
    return value


def compact(**values: Any) -> dict[str, Any]:
    """The values given (not None): the fields of a request body left to the server's defaults are left out."""
    return {k: v for k, v in values.items() if v is not None}
