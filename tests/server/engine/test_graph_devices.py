"""What the decoding graphs ask of the device they serve on, checked without one: the capture and the read-back
of a server on `cuda:1` run on cuda:1's streams whatever device is current on the worker thread (torch.cuda's
device guard, streams, events and graphs replaced by recorders: a fake second device), at most one iteration is in
flight, and a finished request's hidden state holds only its own row."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import pytest
import torch
import txl
from txl.sampling import SamplingParams
from txl_server.engine.jobs import AdvanceJob, GenerateJob, job_result

from tests.helpers.runtimes import running
from tests.helpers.tiny_models import tiny_model

from .graph_cases import MEM_LEN, decode_rows, graphs_over

SERVED = torch.device("cuda", 1)  # the pool's device
WORKER_THREAD = 0  # the device current on the worker thread, which never sets one


@dataclass(frozen=True)
class FakeStream:
    device: int

    def wait_stream(self, other: FakeStream) -> None:
        assert other.device == self.device


class FakeCuda:
    """torch.cuda as far as the graphs use it, on a machine whose current device is WORKER_THREAD: a guard
    that changes the current device, streams and events that say which device they belong to, and a graph
    whose capture records the device the body ran on."""

    def __init__(self) -> None:
        self.current = WORKER_THREAD
        self.recorded: list[FakeStream] = []  # the stream of each event recorded
        self.body_devices: list[int] = []  # the current device at each call of a graph body
        self.streams: list[FakeStream] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = self

        @contextlib.contextmanager
        def device(where):
            before = fake.current
            fake.current = torch.device(where).index
            try:
                yield
            finally:
                fake.current = before

        class Event:
            def record(self, stream=None):
                fake.recorded.append(stream if stream is not None else fake.current_stream())

            def synchronize(self):
                pass

        def stream_on(where=None) -> FakeStream:
            made = FakeStream(fake.current if where is None else torch.device(where).index)
            fake.streams.append(made)
            return made

        class Graph:
            def replay(self):
                pass

        @contextlib.contextmanager
        def graph(graph, pool=None, capture_error_mode="global"):
            yield

        @contextlib.contextmanager
        def stream(s):
            yield

        monkeypatch.setattr(torch.cuda, "device", device)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "current_stream", self.current_stream)
        monkeypatch.setattr(torch.cuda, "Stream", stream_on)
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)

    def current_stream(self, where=None) -> FakeStream:
        return FakeStream(self.current if where is None else torch.device(where).index)


def _graphs_on_a_second_device(monkeypatch):
    model = tiny_model(seed=41, mem_len=MEM_LEN)
    pool = txl.BlockPool(model.memory_layout(), block_size=4, blocks=64, growable=False)
    graphs = graphs_over(model, pool, max_batch_size=2, max_positions=MEM_LEN, capture=False)
    rows = decode_rows(model, pool, [5, 9])
    fake = FakeCuda()
    fake.install(monkeypatch)
    graphs.device = SERVED  # the pool's tensors stay on the CPU: only the device the graphs use is faked
    graphs.capture = True
    return graphs, rows, fake


def test_the_read_back_event_is_recorded_on_the_served_devices_stream(monkeypatch):
    """The event `collect` waits on must follow the copy, which is queued on cuda:1: an event recorded on the
    worker thread's current device (cuda:0) is ready at once, and the host read the tokens before they landed."""
    graphs, _, fake = _graphs_on_a_second_device(monkeypatch)
    readback = torch.tensor([[7.0, -0.5], [3.0, -1.5]], dtype=torch.float64)
    read = graphs._read_back(readback)
    assert fake.recorded == [FakeStream(SERVED.index)]
    assert read.host.tolist() == readback.tolist()


def test_a_capture_runs_under_the_served_device(monkeypatch):
    """The warm-up, the side stream and the capture of a graph all belong to cuda:1."""
    graphs, _, fake = _graphs_on_a_second_device(monkeypatch)

    def body() -> None:
        fake.body_devices.append(fake.current)

    graphs._capture(body)
    assert fake.body_devices == [SERVED.index] * 3  # two warm-up calls, one captured
    assert fake.streams and all(s.device == SERVED.index for s in fake.streams)
    assert fake.current == WORKER_THREAD  # the thread's own device is left as it was


def test_at_most_one_iteration_is_in_flight():
    """The tokens come back through two buffers in turn: sending a third iteration before the first is read
    would overwrite its tokens. It raises instead; once the first is read, the next goes."""
    model = tiny_model(seed=41, mem_len=MEM_LEN)
    pool = txl.BlockPool(model.memory_layout(), block_size=4, blocks=64, growable=False)
    graphs = graphs_over(model, pool, max_batch_size=2, max_positions=MEM_LEN, capture=False)
    rows = decode_rows(model, pool, [5, 9])
    first = graphs.launch(rows)
    second = graphs.launch(rows)
    assert graphs.readbacks.in_flight == 2
    with pytest.raises(RuntimeError, match="already in flight"):
        graphs.launch(rows)
    tokens = [o.token for o in first.collect()]
    assert [o.token for o in first.collect()] == tokens  # read once: a second call gives the same
    third = graphs.launch(rows)
    second.collect()
    third.collect()
    assert graphs.readbacks.in_flight == 0


async def test_a_finished_generation_keeps_only_its_own_hidden_row(make_settings):
    """Rows decoded together through the graphs get views of one [rows, D] tensor; the state a finished request
    hands back owns its row, so that an idle session does not keep its last batch's outputs alive."""
    async with running(make_settings(cuda_graphs=True, max_batch_size=4)) as runtime:
        worker = runtime.worker
        empty = worker.empty_state(worker.model.config.mem_len)
        started = (await job_result(worker, AdvanceJob(empty, [5, 6, 7]))).state
        results = await asyncio.gather(
            *(
                job_result(worker, GenerateJob(started, [], 6, SamplingParams(temperature=0.9, seed=i)))
                for i in range(3)
            )
        )
    for result in results:
        hidden = result.state.last_hidden
        assert hidden.untyped_storage().nbytes() == hidden.numel() * hidden.element_size()
