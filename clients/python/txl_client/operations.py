"""Each operation of the API written once, for both clients: the call it sends and how its answer becomes the
result. `Client` runs them and returns the result; `AsyncClient` runs them and returns an awaitable of it
(endpoints.py). The docstrings here are the methods' documentation.

Work that may take long (append, create with text, import, score, generate) is asked for as a stream (events.py):
its progress goes to `on_progress(tokens_done, tokens_total)`, and the client's timeout bounds the silence between
two events, not the whole call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypedDict, TypeVar, Unpack

import httpx
from pydantic import BaseModel

from .calls import Call, compact, keyed_call, new_idempotency_key, session_call, session_path, step_call
from .errors import TxlError
from .events import result_events
from .types import (
    AppendResult,
    GenerateResult,
    Health,
    ModelCard,
    Progress,
    ScoreResult,
    Session,
    SessionVersion,
    SystemInfo,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

# Called as the server reports progress. The async client also takes a coroutine function: it awaits what the
# callback returns when that is awaitable.
ProgressCallback = Callable[[int, int], object]


@dataclass(frozen=True)
class Operation(Generic[T]):
    """One operation: the call to send, and how its answer becomes the result: read whole (`answer`), or
    streamed (`events`: progress events for `on_progress`, then the result)."""

    call: Call
    answer: Callable[[httpx.Response], T] | None = None
    events: Callable[[dict[str, Any]], Progress | T | None] | None = None
    on_progress: ProgressCallback | None = None


def json_answer(call: Call, read: Callable[[Any], T]) -> Operation[T]:
    """An operation whose answer is JSON, `read` into its result."""

    def answer(response: httpx.Response) -> T:
        try:
            body = response.json()
        except ValueError as exc:
            raise TxlError(f"the server answered {call.path} with something other than JSON") from exc
        return read(body)

    return Operation(call, answer)


def streamed(
    call: Call, result: type[M], on_progress: ProgressCallback | None, kind: str = "result"
) -> Operation[M]:
    """An operation whose answer streams progress, then one `kind` event holding the result."""
    return Operation(call, events=result_events(result, kind), on_progress=on_progress)


def no_answer(response: httpx.Response) -> None:
    return None


def content(response: httpx.Response) -> bytes:
    return response.content


def listed(model: type[M]) -> Callable[[Any], list[M]]:
    """The reader of a list answer, `{"data": [...]}`."""
    return lambda body: [model.model_validate(item) for item in body["data"]]


# ---------------------------------------------------------------------------------------------- sessions


def create_session(
    text: str = "",
    *,
    mem_len: int | None = None,
    ttl_seconds: int | None = None,
    metadata: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    on_progress: ProgressCallback | None = None,
    memory: str | None = None,
) -> Operation[Session]:
    """A new session primed with `text`; `on_progress(tokens_done, tokens_total)` is called as the server
    feeds it (a long text is streamed, so it never times out while progress arrives). With `memory` (an id
    from `memories.create`), after that memory's document (its state shared: as fast for a long document as
    for a short one). Keyed like a step: a retry after a lost response returns the session the first attempt
    made."""
    body = compact(text=text, mem_len=mem_len, ttl_seconds=ttl_seconds, metadata=metadata, memory=memory)
    if not text and on_progress is None:
        return json_answer(keyed_call("POST", "/v1/sessions", body, idempotency_key), Session.model_validate)
    call = keyed_call("POST", "/v1/sessions", {**body, "stream": True}, idempotency_key)
    return streamed(call, Session, on_progress)


def get_session(session_id: str) -> Operation[Session]:
    return json_answer(session_call("GET", session_id), Session.model_validate)


def list_sessions() -> Operation[list[Session]]:
    return json_answer(Call("GET", "/v1/sessions"), listed(Session))


def delete_session(session_id: str, *, idempotency_key: str | None = None) -> Operation[None]:
    """Keyed: a retry after a lost 204 gets the 204 again, not a 404 for the session it deleted."""
    return Operation(keyed_call("DELETE", session_path(session_id), None, idempotency_key), no_answer)


def fork_session(
    session_id: str,
    *,
    metadata: dict[str, Any] | None = None,
    version: int | None = None,
    idempotency_key: str | None = None,
) -> Operation[Session]:
    """A new session continuing from this one's newest version, or from a kept `version` (see `versions`):
    the two share their memory until they differ."""
    body = compact(metadata=metadata, version=version) or None
    return json_answer(step_call(session_id, "fork", body, idempotency_key), Session.model_validate)


def versions(session_id: str) -> Operation[list[SessionVersion]]:
    """The versions the session keeps (the server's TXL_KEEP_VERSIONS, 32 by default), newest first: each a
    committed step (create, append, generate, import, rewind) you can `rewind` to or fork from."""
    return json_answer(session_call("GET", session_id, "/versions"), listed(SessionVersion))


def rewind(session_id: str, version: int, *, idempotency_key: str | None = None) -> Operation[Session]:
    """The session continues from a kept `version`'s memory, exactly as if it had read only that version's
    text. The rewind is itself a step, a new version: nothing is lost, and another rewind undoes it. A
    version no longer kept raises VersionNotFound (its message names the oldest kept one). Keyed, so a retry
    after a lost answer does not rewind (and make a version) twice."""
    call = step_call(session_id, "rewind", {"version": version}, idempotency_key)
    return json_answer(call, lambda body: Session.model_validate(body["session"]))


def append(
    session_id: str,
    text: str,
    *,
    idempotency_key: str | None = None,
    on_progress: ProgressCallback | None = None,
) -> Operation[AppendResult]:
    """Adds `text` to the session; `on_progress(tokens_done, tokens_total)` is called as the server feeds it."""
    call = step_call(session_id, "append", {"text": text, "stream": True}, idempotency_key)
    return streamed(call, AppendResult, on_progress)


def export_snapshot(session_id: str) -> Operation[bytes]:
    """The session's memory and metadata as one safetensors file, for `import_snapshot` (here or elsewhere)."""
    return Operation(session_call("GET", session_id, "/snapshot"), content)


def import_snapshot(
    data: bytes, *, ttl_seconds: int | None = None, idempotency_key: str | None = None
) -> Operation[Session]:
    """A new session (new id, yours) holding an exported session's memory. Streamed, and keyed: a retry after
    a lost response returns the session the first attempt made."""
    params = {"stream": "true", **({"ttl_seconds": str(ttl_seconds)} if ttl_seconds is not None else {})}
    call = Call(
        "POST",
        "/v1/sessions/import",
        idempotency_key=idempotency_key or new_idempotency_key(),
        headers={"Content-Type": "application/octet-stream"},
        content=data,
        params=params,
    )
    return streamed(call, Session, None)


class Sampling(TypedDict, total=False):
    """How `generate` picks its tokens. Unset values take the server's defaults (256 tokens, temperature 1,
    top-p 1)."""

    max_tokens: int | None
    temperature: float | None
    top_k: int | None
    top_p: float | None
    stop: str | list[str] | None
    seed: int | None


class GenerateOptions(Sampling, total=False):
    """`generate`'s keyword arguments besides `stream`."""

    idempotency_key: str | None
    on_progress: ProgressCallback | None


def generate(
    session_id: str, text: str = "", **options: Unpack[GenerateOptions]
) -> Operation[GenerateResult]:
    """Adds `text` (may be empty), then generates. With `stream=True`, the client returns a GenerateStream of
    TokenEvents whose `result` is the final GenerateResult; errors before the first event are raised then.

    A long `text` takes the server a while before the first token: `on_progress(tokens_done, tokens_total)`
    is called as it is fed. The call always streams (without `stream=True` it still returns the
    GenerateResult): while progress and tokens arrive, the client's timeout does not run out."""
    unknown = options.keys() - GenerateOptions.__annotations__.keys()
    if unknown:
        raise TypeError(f"generate() got an unexpected keyword argument {min(unknown)!r}")
    sampling = {k: v for k, v in options.items() if k in Sampling.__annotations__}
    body = {**compact(text=text or None, **sampling), "stream": True}
    call = step_call(session_id, "generate", body, options.get("idempotency_key"))
    return streamed(call, GenerateResult, options.get("on_progress"), "done")


# ---------------------------------------------------------------------------------------------- stateless


def score(
    text: str, *, token_logprobs: bool = False, on_progress: ProgressCallback | None = None
) -> Operation[ScoreResult]:
    """Log-likelihood of a document. `on_progress(tokens_done, tokens_total)` is called as the server
    reports progress (a few times a second on long documents). Not keyed: scoring changes nothing, a retry is
    harmless."""
    body = {"text": text, "token_logprobs": token_logprobs, "stream": True}
    return streamed(Call("POST", "/v1/score", body, changes_nothing=True), ScoreResult, on_progress)


def models() -> Operation[list[ModelCard]]:
    return json_answer(Call("GET", "/v1/models"), listed(ModelCard))


def health() -> Operation[Health]:
    return json_answer(Call("GET", "/health"), Health.model_validate)


def system() -> Operation[SystemInfo]:
    """What serves, and how many requests the server's worker runs now (`work.requests_running`)."""
    return json_answer(Call("GET", "/v1/system"), SystemInfo.model_validate)
