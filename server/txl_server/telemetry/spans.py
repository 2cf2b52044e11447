"""The one-line calls the request path makes into its trace, each a no-op unless the request is traced.

A request's trace is its server span (api/request_ids.py) and, under it, one child per stage:

    session.lease    waiting for the session: this process's queue for it, then its single-writer lease
    session.fetch    its state brought to the device (`txl.session.source`: device, host or redis)
    engine.queue     a job waiting in the worker's inbox until the worker takes it in
    engine.prefill   its input fed, segment by segment (tokens, segments)
    engine.decode    its tokens sampled, one span for all of them (steps, tokens, sampling)
    session.commit   the next version written (its new blocks to the block store: `blocks.write`, then Redis)

The engine's three are drawn from the times the worker stamped on the job (engine/job_timing.py) once it has
ended, so the worker's thread never touches a span. No span stays current across a `yield`: a generator may be
resumed in another task (a stream's), where the context it attached could not be detached.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from .context import RequestContext, carrying, current

if TYPE_CHECKING:
    from txl.sampling import SamplingParams

    from ..engine.job_timing import JobTiming
    from ..sessions.store.blocks import StoredVersion
    from ..sessions.store.versions import Replay, VersionWrite

P = ParamSpec("P")
T = TypeVar("T")


class TimedJob(Protocol):
    """A job of the worker's (engine/jobs.py): what the worker stamped on it. A generation also has `sampling`
    and `max_tokens`."""

    timing: JobTiming


def _traced() -> RequestContext | None:
    """The request being served, if it is traced."""
    context = current()
    return context if context is not None and context.root is not None else None


def traced(
    name: str, attributes: dict[str, Any] | None = None
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """Decorates a coroutine function: each call is a span `name` (the current span while it runs)."""

    def decorate(function: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(function)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            context = _traced()
            if context is None:
                return await function(*args, **kwargs)
            assert context.tracing is not None
            with context.tracing.tracer.start_as_current_span(
                name, attributes=_with_id(context, attributes or {})
            ):
                return await function(*args, **kwargs)

        return run

    return decorate


def annotate(attributes: dict[str, Any]) -> None:
    """Sets `attributes` on the current span (of a traced request)."""
    if _traced() is not None:
        from opentelemetry import trace

        trace.get_current_span().set_attributes(attributes)


def annotate_request(attributes: dict[str, Any]) -> None:
    """Sets `attributes` on the request's own span."""
    context = current()
    if context is not None:
        context.annotate(attributes)


def span_start() -> int:
    """Now, on the clock spans are drawn on (ns since the epoch): the start of a span drawn once it has ended."""
    return time.time_ns()


def session_held(owner: str, session_id: str, *, since: int) -> None:
    """A step holds its session (lease taken since `since`): the lease's span, and the session named in the
    request's span and its log lines."""
    context = current()
    if context is None:
        return
    context.tenant, context.session_id = owner, session_id
    if context.root is not None:
        assert context.tracing is not None
        _span(context, "session.lease", since, time.time_ns(), {"txl.session.id": session_id})
        context.annotate(
            {
                "txl.session.id": session_id,
                "txl.tenant": owner,
                "gen_ai.request.model": context.tracing.model,
                "gen_ai.conversation.id": context.conversation_id or session_id,
            }
        )


def commit_written(version: int, persistence: str, write: VersionWrite | Replay | None) -> None:
    """What a commit writes of its stored version (`write`, in persistence `always`; None: metadata only), on the
    commit's span: the new blocks to the block store (the others it lists are stored already), and the version's
    header and hidden state to Redis beside the session's metadata; for a version written ahead of its blocks
    (a Replay), the token ids it fed (`txl.commit.behind_tokens`), its blocks written after the answer."""
    if _traced() is None:
        return
    attributes: dict[str, Any] = {"txl.session.version": version, "txl.persistence": str(persistence)}
    stored: StoredVersion | None = getattr(write, "stored", None)  # (a Replay has none)
    attributes["txl.commit.blocks"] = len(stored.new_blocks) if stored is not None else 0
    attributes["txl.commit.store_bytes"] = (
        sum(memoryview(b).nbytes for b in stored.new_blocks.values()) if stored is not None else 0
    )
    attributes["txl.commit.redis_bytes"] = (
        len(stored.hidden or b"") + len(stored.header_json()) if stored is not None else 0
    )
    if stored is not None:
        attributes["txl.commit.blocks_listed"] = len(stored.block_ids)
    behind: tuple[int, ...] | None = getattr(write, "tokens", None)
    if behind is not None:
        attributes["txl.commit.behind_tokens"] = len(behind)
    annotate(attributes)


def turn_attributes(response_id: str, conversation_id: str) -> dict[str, str]:
    """A Responses turn's ids: its response, and its conversation (a conversation's, else its session's)."""
    return {"gen_ai.response.id": response_id, "gen_ai.conversation.id": conversation_id}


def turn_started(response_id: str, conversation_id: str) -> None:
    """A Responses turn holds its session: its ids on the request's span (the conversation's wins over the
    session's from then on)."""
    context = current()
    if context is not None:
        context.conversation_id = conversation_id
        context.annotate(turn_attributes(response_id, conversation_id))


def usage(fed: int, cached: int, output: int) -> dict[str, int]:
    """A turn's usage as the Responses API counts it: input tokens fed, plus those served from memory."""
    return {
        "gen_ai.usage.input_tokens": fed + cached,
        "gen_ai.usage.cache_read.input_tokens": cached,
        "gen_ai.usage.output_tokens": output,
    }


def tokens_counted(kind: str, n: int) -> None:
    """The request fed (`ingested`, `scored`) or generated tokens: its gen_ai.usage (as its API's usage counts
    them, but for a Responses turn, whose usage counts its cached context too: `usage`)."""
    context = current()
    if context is None or context.root is None:
        return
    if kind == "generated":
        context.output_tokens += n
        context.annotate({"gen_ai.usage.output_tokens": context.output_tokens})
    else:
        context.input_tokens += n
        context.annotate({"gen_ai.usage.input_tokens": context.input_tokens})


def tier_moved(source: str, target: str) -> None:
    """A state moved between tiers: one brought to the device during a fetch names where it came from."""
    if target == "device":
        annotate({"txl.session.source": source})


def step_text(text: str, output: str | None = None) -> None:
    """What a step read and wrote, on the request's span: only when the operator opted in (TXL_TRACE_TEXT)."""
    context = _traced()
    if context is None or context.tracing is None or not context.tracing.text:
        return
    attributes = {"gen_ai.input.messages": _messages("user", text)}
    if output is not None:
        attributes["gen_ai.output.messages"] = _messages("assistant", output)
    context.annotate(attributes)


def _messages(role: str, text: str) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}], ensure_ascii=False)


def job_spans(job: TimedJob, *, finished: bool) -> None:
    """The spans of a job that has ended (or was abandoned: `finished` false), from the worker's stamps."""
    context = _traced()
    if context is None:
        return
    timing, end = job.timing, time.time_ns()
    admitted = timing.admitted or end
    attributes = {} if timing.admitted else {"txl.cancelled": not finished}
    _span(context, "engine.queue", timing.created, admitted, attributes)
    if timing.segments:
        fed = {"txl.prefill.tokens": timing.fed_tokens, "txl.prefill.segments": timing.segments}
        _span(context, "engine.prefill", admitted, timing.fed_at, fed)
    sampling: SamplingParams | None = getattr(job, "sampling", None)
    if sampling is not None and timing.steps:
        decoded = {
            "txl.decode.steps": timing.steps,
            "txl.decode.tokens": timing.steps,  # one token per step (no speculative decoding)
            **sampling_attributes(sampling, getattr(job, "max_tokens", 0)),
        }
        if not finished:
            decoded["txl.cancelled"] = True
        _span(context, "engine.decode", timing.fed_at or admitted, timing.decoded_at, decoded)


def sampling_attributes(sampling: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """The sampling class (greedy, random, top_k, top_p, top_k+top_p) and its parameters."""
    kinds = [name for name, on in (("top_k", sampling.top_k > 0), ("top_p", sampling.top_p < 1)) if on]
    attributes: dict[str, Any] = {
        "txl.sampling.class": "greedy" if sampling.greedy else "+".join(kinds) or "random",
        "gen_ai.request.temperature": sampling.temperature,
        "gen_ai.request.max_tokens": max_tokens,
    }
    if sampling.top_k:
        attributes["gen_ai.request.top_k"] = sampling.top_k
    if sampling.top_p < 1:
        attributes["gen_ai.request.top_p"] = sampling.top_p
    if sampling.seed is not None:
        attributes["gen_ai.request.seed"] = sampling.seed
    return attributes


async def linked(name: str, work: Coroutine[Any, Any, T], attributes: dict[str, Any]) -> T:
    """Runs `work` (a task of its own that outlives its request: a background response) as a new trace whose
    root span `name` links to the request that started it; its log lines keep that request's id."""
    context = current()
    if context is None or context.root is None:
        return await work
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    assert context.tracing is not None
    link = trace.Link(context.root.get_span_context())
    root = context.tracing.tracer.start_span(
        name, context=otel_context.Context(), links=[link], attributes=_with_id(context, attributes)
    )
    conversation = attributes.get("gen_ai.conversation.id")
    own = RequestContext(
        context.request_id, context.tracing, root, tenant=context.tenant, conversation_id=conversation
    )
    # This task's alone (never detached: the task ends with the work): a new trace, which carries the work's own
    # request context.
    otel_context.attach(trace.set_span_in_context(root, carrying(own, otel_context.Context())))
    try:
        return await work
    except asyncio.CancelledError:  # cancelled by its client, or stopped with the server: not its failure
        root.set_attribute("txl.cancelled", True)
        raise
    except BaseException as exc:
        root.record_exception(exc)
        root.set_status(trace.StatusCode.ERROR, type(exc).__name__)
        raise
    finally:
        root.end()


def _with_id(context: RequestContext, attributes: dict[str, Any]) -> dict[str, Any]:
    return {"txl.request_id": context.request_id, **attributes}


def _span(context: RequestContext, name: str, start: int, end: int, attributes: dict[str, Any]) -> None:
    """A finished span under the current span, drawn from `start` to `end` (never current itself)."""
    assert context.tracing is not None
    span = context.tracing.tracer.start_span(name, start_time=start, attributes=_with_id(context, attributes))
    span.end(end_time=max(start, end))
