"""docs/api.md's two error tables say what the server sends: the server's own (status, type) of every error it
has, and on the OpenAI routes the (status, type, code) that the same errors become there (`openai_body`), with
the codes of their own (an unknown model, a previous response that cannot be continued, the shutdown)."""

from __future__ import annotations

import re
from pathlib import Path

from txl_server import errors
from txl_server.admission.policy import FIRST_TOKEN_TARGET, FLEX_CAPACITY
from txl_server.admission.slots import SERVER_CONCURRENCY, TENANT_CONCURRENCY, TENANT_SHARE
from txl_server.api.shared.openai_errors import ModelNotFound, openai_body, openai_status
from txl_server.api.shutdown import REFUSED, UNAVAILABLE_STATUS
from txl_server.engine.gate import DEVICE_MEMORY_FULL, QUEUE_FULL
from txl_server.sessions.conversations import ConversationNotFound, ConversationOutOfStep, ItemInMemory
from txl_server.sessions.responses import ContextTooLong, PreviousResponseNotFound
from txl_server.sessions.store.conversations import ConversationLocked

# The reasons a 429 gives (docs/api.md, "Refusals and service tiers").
REFUSALS = (
    FIRST_TOKEN_TARGET, FLEX_CAPACITY, SERVER_CONCURRENCY, TENANT_CONCURRENCY, TENANT_SHARE, QUEUE_FULL,
    DEVICE_MEMORY_FULL,
)  # fmt: skip
API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
# Errors that never reach an OpenAI route: no OpenAI route takes an Idempotency-Key.
NOT_ON_OPENAI_ROUTES = {"idempotency_key_reused"}
# Answered by the framework's handlers (app.py): a route called with a method it does not take.
METHOD_NOT_ALLOWED = (405, "invalid_request")


def table_after(heading: str) -> list[list[str]]:
    """The rows of the first table after `heading`, each cell stripped of its backticks."""
    text = API_MD.read_text()
    start = text.index(heading)
    rows = []
    for line in text[start:].splitlines():
        if line.startswith("|"):
            cells = [cell.replace("`", "").strip() for cell in line.strip("|").split("|")]
            if not set(cells[0]) <= {"-", " "}:
                rows.append(cells)
        elif rows:
            break
    return rows[1:]  # without the header


def native_errors() -> set[tuple[int, str]]:
    """(status, type) of every error the server answers in its own shape."""
    found = {METHOD_NOT_ALLOWED}
    stack: list[type[errors.ServiceError]] = [errors.ServiceError]
    while stack:
        kind = stack.pop()
        stack += kind.__subclasses__()
        if kind is not PreviousResponseNotFound:  # OpenAI's own error, on the Responses API only
            found.add((kind.status, kind.type))
    return found


def openai_errors() -> set[tuple[int, str, str]]:
    """(status, type, code or "null") of every error the OpenAI routes answer."""
    found = set()
    for status, kind in native_errors():
        if kind not in NOT_ON_OPENAI_ROUTES:
            error = openai_body(status, {"type": kind, "message": "", "param": None})["error"]
            found.add((openai_status(status), error["type"], error["code"] or "null"))
    coded = [
        (ModelNotFound.status, ModelNotFound("x", "y").body()["error"]),
        (PreviousResponseNotFound.status, PreviousResponseNotFound("x").body()["error"]),
        *((e.status, e.body()["error"]) for e in (ContextTooLong(1, 1), ConversationNotFound("x"))),
        *(
            (e.status, e.body()["error"])
            for e in (ConversationLocked(), ItemInMemory(), ConversationOutOfStep(2, 1))
        ),
        (UNAVAILABLE_STATUS, REFUSED),
        *((errors.Overloaded.status, errors.Overloaded("x", code=code).body()["error"]) for code in REFUSALS),
    ]
    for status, native in coded:
        error = openai_body(status, native)["error"]
        found.add((openai_status(status), error["type"], error["code"]))
    return found


def test_the_servers_error_table_lists_every_error_it_sends():
    documented = {(int(status), kind) for status, kind, _ in table_after("**Errors.** Every error has")}
    assert documented == native_errors()


def test_the_openai_error_table_lists_what_the_openai_routes_send():
    documented = set()
    for statuses, kind, codes, _ in table_after("### Errors on the OpenAI routes"):
        statuses_, codes_ = re.split(r",\s*", statuses), re.split(r",\s*", codes)
        assert len(statuses_) == len(codes_) or len(statuses_) == 1 or len(codes_) == 1, (statuses, codes)
        pairs = (
            zip(statuses_, codes_, strict=True)
            if len(statuses_) == len(codes_)
            else [(s, c) for s in statuses_ for c in codes_]
        )
        documented |= {(int(status), kind, code) for status, code in pairs}
    assert documented == openai_errors()
