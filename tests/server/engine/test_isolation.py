"""One failing row fails alone: a value one client sends never fails another client's request in the same step.

Two layers, each tested with a fault no validator knows, injected into the rows sampled with one seed: a step
that raises when it holds such a row (the worker then runs the step's rows one by one, and only the row that
fails alone fails), and a row whose log-probabilities become NaN (the sampler still returns an id in range, and
the host ends that row's request when it reads the NaN back). The others' tokens are exactly those they get
without the faulty neighbour. Then the same over HTTP, on every route that streams, beside a client sending
the values that used to break a step (a subnormal temperature or top_p).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from txl.sampling import SamplingParams, signed64
from txl_server.engine import graphs as graphs_module
from txl_server.engine import runner as runner_module
from txl_server.engine.jobs import GenerateJob
from txl_server.errors import RowFailed

from tests.helpers.live_server import live_server_fixture
from tests.helpers.runtimes import running
from tests.helpers.sse import DONE, sse_payloads

OWNER = "tenant-isolation"
POISON_SEED = 424_242_424_242
PROMPTS = ["The sea was calm", "1234567890 abcdefghij", "Once upon a time", "a"]
TOKENS = 24
LONG_TEXT = "A long text is fed segment by segment beside the decoding rows. " * 4
FAULT_FROM = 4  # the poisoned request's first tokens sample normally: by then the others decode beside it


class InjectedFault(RuntimeError):
    pass


class Fault:
    """Replaces the sampler of the eager runner and of the decoding graphs: rows sampled with POISON_SEED, from
    their FAULT_FROM-th token on, either fail the whole call ("raise") or get NaN log-probabilities ("nan").
    Records how many rows shared a call with a poisoned row."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
        self.kind = kind
        self.batch_sizes: list[int] = []
        self.original = runner_module.sample_rows
        monkeypatch.setattr(runner_module, "sample_rows", self.sample_rows)
        monkeypatch.setattr(graphs_module, "sample_rows", self.sample_rows)

    def sample_rows(
        self, log_probs: torch.Tensor, rows: Any, readback: torch.Tensor | None = None, *, path: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        poisoned = (rows.seeds == signed64(POISON_SEED)) & (rows.counters >= FAULT_FROM)  # [N]
        if poisoned.any():
            self.batch_sizes.append(int(poisoned.numel()))
            if self.kind == "raise":
                raise InjectedFault("a fault no validator knows")
            log_probs = log_probs.masked_fill(poisoned[:, None], float("nan"))
        return self.original(log_probs, rows, readback, path=path)


def together(worker: Any, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker receives the next `n` generations at once (whatever the machine's speed), so that they decode
    side by side."""
    held: list[GenerateJob] = []
    submit = worker.submit

    def holding(job: Any) -> None:
        if not isinstance(job, GenerateJob):
            submit(job)
            return
        held.append(job)
        if len(held) == n:
            for each in held:
                submit(each)

    monkeypatch.setattr(worker, "submit", holding)


def sampling(i: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, top_p=0.95, seed=1000 + i)


async def tokens_of(service: Any, session_id: str, params: SamplingParams) -> list[int]:
    ids = []
    async for event in service.generate(OWNER, session_id, max_tokens=TOKENS, sampling=params):
        if hasattr(event, "id"):
            ids.append(event.id)
    return ids


@pytest.mark.parametrize("kind", ["raise", "nan"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
async def test_a_failing_row_fails_alone_and_its_neighbours_get_their_exact_tokens(
    make_settings, monkeypatch, kind, graphs
):
    settings = make_settings(cuda_graphs=graphs, overlap=graphs)
    async with running(settings) as rt:
        service = rt.service
        sessions = [await service.create(OWNER, text=text) for text in PROMPTS]
        poisoned = await service.create(OWNER, text="The poisoned request reads this")
        reader = await service.create(OWNER, text="A reader")
        # What each session's next tokens are, and what the reader's append scores, without the faulty
        # neighbour: on forks (the same memory).
        forks = [await service.fork(OWNER, s.id) for s in sessions]
        expected = await asyncio.gather(*(tokens_of(service, f.id, sampling(i)) for i, f in enumerate(forks)))
        reader_fork = await service.fork(OWNER, reader.id)
        expected_read = (await service.append(OWNER, reader_fork.id, LONG_TEXT)).logprob

        fault = Fault(monkeypatch, kind)
        together(rt.worker, len(sessions) + 1, monkeypatch)
        results = await asyncio.gather(
            *(tokens_of(service, s.id, sampling(i)) for i, s in enumerate(sessions)),
            tokens_of(service, poisoned.id, SamplingParams(temperature=0.8, seed=POISON_SEED)),
            service.append(OWNER, reader.id, LONG_TEXT),  # segments fed in the same steps
            return_exceptions=True,
        )

        after = await service.get(OWNER, poisoned.id)

    *normal, bad, read = results
    assert normal == expected  # every neighbour: all its tokens, exactly
    assert read.logprob == pytest.approx(expected_read, abs=1e-4)  # and the segments fed beside them
    assert isinstance(bad, InjectedFault if kind == "raise" else RowFailed)
    assert max(fault.batch_sizes) >= 2  # the poisoned row did share a step
    assert after.version == poisoned.version  # nothing committed for the failed request


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 1e-40},
        {"temperature": 5e-324},
        {"temperature": 1e-40, "top_p": 1e-40},
        {"temperature": 0.7, "top_p": 5e-324},
        {"temperature": 1e-45, "top_k": 3},
    ],
)
async def test_subnormal_sampling_values_sample_the_best_token(runtime, params):
    """Values that once underflowed every score (and drew an id past the vocabulary's end) now sample as the
    smallest float32 number: the greedy token."""
    service = runtime.service
    session = await service.create(OWNER, text="Tiny temperatures are greedy")
    fork = await service.fork(OWNER, session.id)
    greedy = await tokens_of(service, fork.id, SamplingParams(temperature=0))
    assert await tokens_of(service, session.id, SamplingParams(**params, seed=7)) == greedy


# ---------------------------------------------------------------------------------------------- over HTTP

server = live_server_fixture("isolation", max_batch_size=16, chat_template="<|{role}|>{content}<|end|>\\n")
STREAM_TOKENS = 40


def _stream_lines(client: httpx.Client, path: str, body: dict) -> list[str]:
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        return list(response.iter_lines())


def session_stream(client: httpx.Client) -> int:
    session = client.post("/v1/sessions", json={"text": "A session stream"}).json()
    body = {"max_tokens": STREAM_TOKENS, "temperature": 0.9, "seed": 1, "stream": True}
    events = sse_payloads(_stream_lines(client, f"/v1/sessions/{session['id']}/generate", body))
    assert events[-1] == DONE and events[-2]["type"] == "done", events[-3:]
    return events[-2]["usage"]["completion_tokens"]


def completions_stream(client: httpx.Client) -> int:
    body = {
        "prompt": "A completions stream",
        "max_tokens": STREAM_TOKENS,
        "temperature": 0.9,
        "seed": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse_payloads(_stream_lines(client, "/v1/completions", body))
    assert events[-1] == DONE and "error" not in events[-2], events[-3:]
    return events[-2]["usage"]["completion_tokens"]


def chat_stream(client: httpx.Client) -> int:
    body = {
        "messages": [{"role": "user", "content": "A chat stream"}],
        "max_tokens": STREAM_TOKENS,
        "temperature": 0.9,
        "seed": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse_payloads(_stream_lines(client, "/v1/chat/completions", body))
    assert events[-1] == DONE and "error" not in events[-2], events[-3:]
    return events[-2]["usage"]["completion_tokens"]


def responses_stream(client: httpx.Client) -> int:
    body = {
        "input": "A responses stream",
        "max_output_tokens": STREAM_TOKENS,
        "temperature": 0.9,
        "stream": True,
    }
    events = [e for e in sse_payloads(_stream_lines(client, "/v1/responses", body)) if e != DONE]
    last = events[-1]
    assert last["type"] == "response.incomplete", last["type"]  # cut at max_output_tokens
    return last["response"]["usage"]["output_tokens"]


ROUTES = [session_stream, completions_stream, chat_stream, responses_stream]


@contextlib.contextmanager
def in_threads(server: Any, calls: list) -> Iterator[list[Any]]:
    """Runs each call with a client of its own, in a thread of its own; the results once all are done."""
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            try:
                results[i] = calls[i](client)
            except Exception as exc:  # reported by the test
                results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    yield results
    for thread in threads:
        thread.join(180)


def hostile(body: dict) -> Any:
    def send(client: httpx.Client) -> httpx.Response:
        return client.post("/v1/completions", json={"prompt": "hostile", "max_tokens": 12, **body})

    return send


def test_every_route_streams_to_its_end_beside_a_request_whose_row_fails(server, monkeypatch):
    fault = Fault(monkeypatch, "raise")
    hostile_requests = [
        hostile({"temperature": 0.9, "seed": POISON_SEED}),  # the injected fault
        hostile({"temperature": 1e-40}),  # used to draw an id past the vocabulary's end
        hostile({"temperature": 5e-324, "top_p": 5e-324}),
    ]
    together(server.app.state.runtime.service.worker, len(ROUTES) + len(hostile_requests), monkeypatch)
    with in_threads(server, [*ROUTES, *hostile_requests]) as results:
        pass
    streamed, answers = results[: len(ROUTES)], results[len(ROUTES) :]
    assert streamed == [STREAM_TOKENS] * len(ROUTES), streamed
    poisoned, tiny, tinier = answers
    assert poisoned.status_code == 500 and poisoned.json()["error"]["type"] == "server_error"
    assert tiny.status_code == 200 and tinier.status_code == 200
    assert max(fault.batch_sizes) >= 2, fault.batch_sizes
