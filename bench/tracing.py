"""What tracing costs: the server with tracing off against the tree before tracing came (`BEFORE`, read from git),
and with every request traced (`OTEL_TRACES_SAMPLER_ARG=1.0`, its spans sent over OTLP/HTTP to a receiver in this
process that reads and drops them), in one run: three server processes on the bundled model (each tree on
PYTHONPATH alike), taking turns request by request, the order rotated each time, so that the load of whatever
else shares the machine's cores drifts alike for all three.

Workloads, one client sending one request at a time: `GET /v1/sessions/{id}` (the layers around a route: the key,
Redis, JSON; one span when traced); a session step, `POST /v1/sessions/{id}/generate` of 16 tokens, not streamed
(lease, fetch, the engine, the commit: 8 spans); a streamed generation of 256 tokens (tokens/s after the first).
Per request: the client's median time, and the server process's CPU time (user + system from /proc, the
exporter's thread included) over all its requests of that kind.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from txl_server.check.benchmark_docs import Section

from .common import ROOT, export_revision
from .http import Server

BEFORE = "09e84fe"  # main before tracing was merged (issue 48)
PHASES = 3  # the servers started anew, in another order
HTTP_REQUESTS = 1800  # per server, over the phases
STEPS = 120
STREAMS = 24
STEP_TOKENS = 16
STREAM_TOKENS = 256
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Sink:
    """An OTLP/HTTP endpoint that reads each export and answers 200 (no decoding: its CPU is this process's);
    with `keep`, it keeps the exports for `spans`."""

    def __init__(self, keep: bool = False) -> None:
        sink = self
        self.exports = 0
        self.bytes = 0
        self.kept: list[bytes] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                sink.exports += 1
                sink.bytes += len(body)
                if keep:
                    sink.kept.append(body)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()

    def spans(self) -> list[tuple[str, str, int, int]]:
        """(name, trace id, start ns, end ns) of every span kept."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        out = []
        for body in self.kept:
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
                for scope in resource.scope_spans:
                    for s in scope.spans:
                        out.append((s.name, s.trace_id.hex(), s.start_time_unix_nano, s.end_time_unix_nano))
        return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_path(tree: Path) -> str:
    return os.pathsep.join(str(tree / part) for part in ("model", "server"))


class Client:
    """A client of one server, with a session of its own on it (warmed: kernels built, caches filled)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.http = httpx.Client(base_url=server.url, timeout=120)
        text = {"text": "It was the best of times, it was the worst"}
        self.path = f"/v1/sessions/{self.http.post('/v1/sessions', json=text).json()['id']}"
        self.step()
        self.decode_rate()

    def get(self) -> float:
        """Seconds for one `GET /v1/sessions/{id}`."""
        started = time.perf_counter()
        self.http.get(self.path).raise_for_status()
        return time.perf_counter() - started

    def step(self) -> float:
        """Seconds for one step of STEP_TOKENS tokens."""
        started = time.perf_counter()
        body = {"text": " of", "max_tokens": STEP_TOKENS, "temperature": 0}
        self.http.post(self.path + "/generate", json=body).raise_for_status()
        return time.perf_counter() - started

    def decode_rate(self) -> float:
        """Tokens per second of a streamed generation of STREAM_TOKENS tokens, after its first."""
        body = {"text": " times", "max_tokens": STREAM_TOKENS, "temperature": 1.0, "seed": 1, "stream": True}
        stamps = []
        with self.http.stream("POST", self.path + "/generate", json=body) as response:
            for line in response.iter_lines():
                if line.startswith('data: {"type":"token"'):
                    stamps.append(time.perf_counter())
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])


class Figures:
    """What `measure` returned for each request, and the CPU seconds the server spent on them, per server."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def add(self, clients: dict[str, Client], requests: int, measure: Callable[[Client], float]) -> None:
        """`requests` requests per server, the servers taking turns request by request (the order rotated each
        time)."""
        cpu = {name: cpu_seconds(c.server.process.pid) for name, c in clients.items()}
        names = list(clients)
        for i in range(requests):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                self.values.setdefault(name, []).append(measure(clients[name]))
        for name, client in clients.items():
            spent = cpu_seconds(client.server.process.pid) - cpu[name]
            self.cpu.setdefault(name, []).extend([spent / requests] * requests)

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])

    def spread(self, name: str) -> str:
        """The middle half of the values: from the 25th to the 75th percentile."""
        if len(self.values[name]) < 2:
            return "-"
        low, _, high = statistics.quantiles(self.values[name], n=4)
        return f"{low:.0f}-{high:.0f}"

    def cpu_per_request(self, name: str) -> float:
        return statistics.fmean(self.cpu[name])


def untraced_costs(requests: int = 20000) -> tuple[float, float]:
    """What runs with tracing off, alone: (µs per request of the request-id layer, over the same call without
    it; ns per token of the worker's stamps, engine/job_timing.py)."""
    import asyncio

    from txl_server.api.request_ids import RequestIds
    from txl_server.engine.job_timing import JobTiming

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"{}"})

    async def sent(message: dict) -> None:
        pass

    async def received() -> dict:
        return {"type": "http.request"}

    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"user-agent", b"python-httpx/0.28.1"),
        (b"authorization", b"Bearer k"),
    ]

    async def per_call(call: Callable) -> float:
        started = time.perf_counter()
        for _ in range(requests):
            scope = {
                "type": "http",
                "path": "/v1/sessions/x",
                "method": "GET",
                "headers": headers,
                "state": {},
            }
            await call(scope, received, sent)
        return (time.perf_counter() - started) / requests

    async def layer() -> float:
        wrapped = RequestIds(app, tracing=None)
        return min([await per_call(wrapped) - await per_call(app) for _ in range(3)])

    timing = JobTiming()
    started = time.perf_counter()
    for _ in range(requests * 10):
        timing.decoded()
    stamp = (time.perf_counter() - started) / (requests * 10)
    return asyncio.run(layer()) * 1e6, stamp * 1e9


def span_cost(requests: int = 2000) -> float:
    """CPU seconds per traced request of 8 spans (a step's: its server span with its attributes and 7 children
    with theirs), made and sent through the SDK as the server sets it up: batches over OTLP/HTTP to a receiver
    in this process (whose reading is counted too: an upper bound)."""
    from opentelemetry import trace
    from txl_server.settings import Settings
    from txl_server.telemetry.tracing import Tracing

    sink = Sink()
    saved = dict(os.environ)
    os.environ.update(OTEL_EXPORTER_OTLP_ENDPOINT=sink.url, OTEL_BSP_MAX_QUEUE_SIZE=str(16 * requests))
    try:
        tracing = Tracing.from_env(Settings(), instance="bench")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert tracing is not None
    tracer = tracing.tracer
    http = {"http.request.method": "POST", "url.path": "/v1/sessions/x/generate", "http.route": "/v1/sessions/{session_id}/generate",
            "url.scheme": "http", "server.address": "127.0.0.1", "server.port": 8000, "client.address": "127.0.0.1",
            "network.protocol.version": "1.1", "user_agent.original": "python-httpx/0.28.1", "txl.request_id": "0" * 32,
            "txl.tenant": "0" * 32, "txl.session.id": "s" * 32, "gen_ai.request.model": "txl-books-byte",
            "gen_ai.conversation.id": "s" * 32, "gen_ai.usage.input_tokens": 3, "gen_ai.usage.output_tokens": 16,
            "http.response.status_code": 200}  # fmt: skip
    child = {"txl.request_id": "0" * 32, "txl.prefill.tokens": 3, "txl.prefill.segments": 1}
    started = time.process_time()
    for _ in range(requests):
        root = tracer.start_span("POST", kind=trace.SpanKind.SERVER, attributes=http)
        parent = trace.set_span_in_context(root)
        for name in ("session.lease", "session.fetch", "engine.queue", "engine.prefill", "engine.queue",
                     "engine.decode", "session.commit"):  # fmt: skip
            tracer.start_span(name, context=parent, attributes=child).end()
        root.end()
    tracing.provider.force_flush()
    spent = time.process_time() - started
    tracing.provider.shutdown()
    sink.close()
    return spent / requests


def timeline(output_tokens: int = 32) -> str:
    """One chained Responses turn on the bundled model, traced, drawn as a timeline (its spans, in order)."""
    sink = Sink(keep=True)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    server = Server(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_BSP_SCHEDULE_DELAY": "100"})
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            first = {"input": "It was the best of times,", "max_output_tokens": 8}
            body = {
                "input": " it was the worst of times, it was the age of wisdom, it was the age of",
                "previous_response_id": client.post("/v1/responses", json=first).json()["id"],
                "max_output_tokens": output_tokens,
            }
            traceparent = {"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}
            client.post("/v1/responses", json=body, headers=traceparent).raise_for_status()
        deadline = time.monotonic() + 10
        while not any(s[0].startswith("POST") for s in sink.spans() if s[1] == trace_id):
            if time.monotonic() > deadline:
                raise RuntimeError("the turn's trace did not arrive")
            time.sleep(0.05)
    finally:
        server.stop()
        sink.close()
    spans = sorted((s for s in sink.spans() if s[1] == trace_id), key=lambda s: (s[2], -s[3]))
    start, end = spans[0][2], spans[0][3]
    width, lines = 48, []
    for name, _, begin, finish in spans:
        left = round(width * (begin - start) / (end - start))
        bar = max(1, round(width * (finish - begin) / (end - start)))
        label = name if name.startswith("POST") else "  " + name
        lines.append(
            f"{label:<22} {(begin - start) / 1e6:6.1f} ms {(finish - begin) / 1e6:6.1f} ms  "
            f"|{' ' * left}{'#' * bar}{' ' * max(0, width - left - bar)}|"
        )
    header = f"{'span':<22} {'starts':>9} {'lasts':>9}"
    return "\n".join(["```", header, *lines, "```"])


def run(quick: bool = False) -> Section:
    section = Section("tracing", "Tracing: what it costs, off and on", "python -m bench tracing")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    sink = Sink()
    phases, scale = (1, 4) if quick else (PHASES, 1)
    gets, steps, streams = Figures(), Figures(), Figures()
    with tempfile.TemporaryDirectory(prefix="txl-tracing-") as tmp:
        before_tree = export_revision(BEFORE, Path(tmp) / "before")
        traced = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "1.0",
        }
        untraced = {name: "" for name in traced}  # whatever this shell's environment says
        configs = {
            f"before ({BEFORE})": {**untraced, "PYTHONPATH": tree_path(before_tree)},
            "tracing off": {**untraced, "PYTHONPATH": tree_path(ROOT)},
            "tracing on (ratio 1.0)": {**traced, "PYTHONPATH": tree_path(ROOT)},
        }
        names = list(configs)
        for phase in range(phases):
            # Started in turn too: on this machine the first process started ran slower, whatever its code.
            order = names[phase:] + names[:phase]
            servers = {name: Server(None, configs[name]) for name in order}
            try:
                clients = {name: Client(servers[name]) for name in names}
                gets.add(clients, HTTP_REQUESTS // phases // scale, Client.get)
                steps.add(clients, STEPS // phases // scale, Client.step)
                streams.add(clients, 1 if quick else STREAMS // phases, Client.decode_rate)
            finally:
                for server in servers.values():
                    server.stop()
    sink.close()
    rows = [
        [
            name,
            gets.median(name) * 1e3,
            gets.cpu_per_request(name) * 1e3,
            steps.median(name) * 1e3,
            steps.cpu_per_request(name) * 1e3,
            streams.median(name),
            streams.spread(name),
            streams.cpu_per_request(name) / STREAM_TOKENS * 1e3,
        ]
        for name in names
    ]
    counts = ", ".join(
        f"{len(f.values[names[0]])} {what}"
        for f, what in ((gets, "GETs"), (steps, "steps"), (streams, "streams"))
    )
    section.table(
        f"Per request, ms: the client's median time and the server's CPU ({counts} per server, the servers in "
        f"turns, in {phases} runs started in turn)",
        ["server", "GET session", "its CPU", f"step of {STEP_TOKENS} tokens", "its CPU", "decode tokens/s",
         "its middle half", "CPU per token"],
        rows,
    )  # fmt: skip
    before, off, on = names
    section.note(
        f"Tracing off against {BEFORE}: GET {100 * gets.median(off) / gets.median(before):.0f}%, "
        f"step {100 * steps.median(off) / steps.median(before):.0f}%, "
        f"decode {100 * streams.median(off) / streams.median(before):.0f}% (100%: the same). "
        f"Tracing on, every request: {1e6 * (gets.cpu_per_request(on) - gets.cpu_per_request(off)):.0f} µs of "
        f"server CPU per GET ({1e6 * (gets.median(on) - gets.median(off)):+.0f} µs of client time), "
        f"{1e6 * (steps.cpu_per_request(on) - steps.cpu_per_request(off)):.0f} µs per step "
        f"({1e6 * (steps.median(on) - steps.median(off)):+.0f} µs of client time); decode "
        f"{100 * streams.median(on) / streams.median(off):.0f}% of off. The receiver took {sink.exports} exports "
        f"({sink.bytes / 1024:.0f} KiB)."
    )
    per_step = span_cost(200 if quick else 2000)
    layer, stamp = untraced_costs(2000 if quick else 20000)
    section.note(
        f"Alone, in this process: with tracing off, the request-id layer costs {layer:.1f} µs per request and "
        f"the worker's stamps {stamp:.0f} ns per token (`untraced_costs`); with tracing on, a step's 8 spans made "
        f"and sent through the SDK cost {1e6 * per_step:.0f} µs of CPU, the receiving end included "
        "(`span_cost`)."
    )
    section.note('One chained Responses turn, traced (docs/deploy.md, "Traces and logs"):\n\n' + timeline())
    return section
