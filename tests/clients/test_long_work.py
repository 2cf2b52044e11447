"""Long work through the SDKs (docs/clients.md, "Long work and timeouts"): every call that may take long streams,
so the timeout bounds the server's silence, not the work; a 1 MiB append with the defaults succeeds; snapshots
go out and come back; 409 conflicts are retried when asked, honouring Retry-After."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from txl_client import AsyncClient, Client, Conflict, Session
from txl_client.calls import Call
from txl_client.errors import Overloaded
from txl_client.options import Options
from txl_client.retry_rule import retry_delay

from tests.helpers.gate import Gate
from tests.helpers.live_server import LiveServer
from tests.helpers.tiny_models import make_byte_model_dir

from .conftest import API_KEY, server_settings

TEXT = (
    "It was the best of times, it was the worst of times. " * 4
)  # 212 tokens: 27 segments of the tiny model


def slowed(server: LiveServer, seconds: float) -> Gate:
    """Every forward of the engine (a segment of 8 tokens of the tiny model) takes `seconds` longer."""
    return Gate(server.app.state.runtime.service.worker.runner, "run", delay=seconds)


# ---------------------------------------------------------------------------------------------- long work


@pytest.fixture(scope="module")
def roomy(tmp_path_factory, redis_server):
    """A server with the default limits (1 MiB of text per append) on a model small enough to read 1 MiB in
    seconds: one layer, one head, 256-token segments (the test measures the path, not the model)."""
    model = make_byte_model_dir(
        tmp_path_factory.mktemp("models") / "smallest",
        n_layer=1, n_head=1, d_head=8, d_model=8, d_embed=8, d_inner=16, mem_len=8, tgt_len=256,
    )  # fmt: skip
    with LiveServer(server_settings(model, redis_server.url)) as live:
        yield live


def test_a_1_mib_append_with_the_default_settings_succeeds(roomy):
    text = ("It was the best of times, it was the worst of times. " * 20_200)[: 1024 * 1024]
    seen: list[tuple[int, int]] = []
    with Client(roomy.url) as client:
        session = client.create_session()
        appended = client.append(session.id, text, on_progress=lambda *p: seen.append(p))
    assert appended.tokens == len(text) == 1024 * 1024
    assert appended.session.tokens == session.tokens + len(text) and appended.session.version == 2
    assert seen[0] == (0, len(text)) and seen[-1] == (len(text), len(text)) and len(seen) > 10


def test_slow_work_that_reports_progress_outlives_a_short_timeout(server):
    """Each call below takes the server ~3 s, against a client that waits at most 1 s for news."""
    with Client(server.url, API_KEY, timeout=1.0) as client, slowed(server, 0.1):
        created_progress: list[tuple[int, int]] = []
        session = client.create_session(TEXT, on_progress=lambda *p: created_progress.append(p))
        assert session.tokens == len(TEXT) and created_progress[-1] == (len(TEXT), len(TEXT))
        appended = client.append(session.id, TEXT)
        assert appended.session.version == 2 and appended.tokens == len(TEXT)
        assert client.score(TEXT).tokens == len(TEXT)


async def test_async_slow_work_outlives_a_short_timeout_and_snapshots_round_trip(server):
    async with AsyncClient(server.url, API_KEY, timeout=1.0) as client:
        with slowed(server, 0.1):  # ~3 s
            session = await client.create_session(TEXT)
            appended = await client.append(session.id, "!")
        assert appended.session.tokens == len(TEXT) + 1
        data = await client.export_snapshot(session.id)
        copies = await asyncio.gather(
            client.import_snapshot(data), client.import_snapshot(data, ttl_seconds=60)
        )
        assert all(isinstance(c, Session) and c.tokens == appended.session.tokens for c in copies)
        assert len({c.id for c in copies} | {session.id}) == 3
        assert copies[1].expires_at - copies[1].created_at in (60, 61)


def test_a_snapshot_import_is_keyed_and_generates_like_its_source(server):
    with Client(server.url, API_KEY) as client:
        source = client.create_session(text=TEXT)
        data = client.export_snapshot(source.id)
        before = len(client.list_sessions())
        copy = client.import_snapshot(data, idempotency_key="import-me")
        assert (
            client.import_snapshot(data, idempotency_key="import-me") == copy
        )  # a retry makes no second one
        assert len(client.list_sessions()) == before + 1
        one = client.generate(source.id, max_tokens=12, temperature=0)
        two = client.generate(copy.id, max_tokens=12, temperature=0)
        assert one.text == two.text


# ---------------------------------------------------------------------------------------------- conflicts


def test_conflicts_are_retried_only_when_asked(server):
    with Client(server.url, API_KEY) as client:
        session = client.create_session(text="busy")
        holder = threading.Thread(target=client.append, args=(session.id, TEXT))
        with slowed(server, 0.1) as gate:  # the holder's append takes ~3 s
            holder.start()
            assert gate.entered.wait(10)  # it holds the session
            with pytest.raises(Conflict) as caught:
                client.append(session.id, "!")
            assert caught.value.status == 409
            patient = client.with_options(retry_conflicts=True, max_retries=8)
            appended = patient.append(session.id, "!")  # waits for the holder, then steps
        holder.join()
    assert appended.session.version == 3 and appended.session.tokens == 4 + len(TEXT) + 1


class Flaky(BaseHTTPRequestHandler):
    """Answers the first `conflicts` POSTs with 409 (and Retry-After, if set), then a result stream."""

    conflicts, retry_after, seen = 2, "1", []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Flaky.seen.append(time.monotonic())
        if len(Flaky.seen) <= Flaky.conflicts:
            body = json.dumps({"error": {"type": "conflict", "message": "busy", "param": None}}).encode()
            self.send_response(409)
            if Flaky.retry_after is not None:
                self.send_header("Retry-After", Flaky.retry_after)
            self.send_header("Content-Type", "application/json")
        else:
            result = {"type": "result", "tokens": 1, "bytes": 1, "logprob": -1.0, "nll": 1.0,
                      "perplexity": 2.7, "bits_per_byte": 1.4}  # fmt: skip
            body = f"data: {json.dumps(result)}\n\ndata: [DONE]\n\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("retry_after", ["1", None])
def test_conflict_retries_wait_retry_after_when_the_server_sends_it(retry_after):
    Flaky.retry_after, Flaky.seen = retry_after, []
    with ThreadingHTTPServer(("127.0.0.1", 0), Flaky) as http:
        threading.Thread(target=http.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{http.server_address[1]}"
        with Client(url, retry_conflicts=True, max_retries=2) as client:
            assert client.score("x").tokens == 1
        http.shutdown()
    gaps = [b - a for a, b in zip(Flaky.seen, Flaky.seen[1:], strict=False)]
    assert len(Flaky.seen) == 3
    if retry_after is not None:
        assert min(gaps) >= 0.95  # Retry-After: 1
    else:
        assert max(gaps) < 0.9  # the client's own backoff: 0.125-0.25 s, then 0.25-0.5 s


def test_the_retry_rule_for_conflicts_and_overload():
    options = Options.resolve("http://x", None, timeout=1, max_retries=3, retry_overloaded=False)
    keyed = Call("POST", "/v1/sessions/s/append", {}, idempotency_key="k")
    conflict = Conflict("busy", retry_after=2.5)
    assert retry_delay(options, keyed, conflict, attempt=0, after_lost_response=False) is None
    patient = options.with_changes(retry_conflicts=True)
    assert retry_delay(patient, keyed, conflict, attempt=0, after_lost_response=False) == 2.5
    assert retry_delay(patient, keyed, conflict, attempt=3, after_lost_response=False) is None
    assert (
        0.125 <= retry_delay(patient, keyed, Conflict("busy"), attempt=0, after_lost_response=False) <= 0.25
    )
    assert retry_delay(options, keyed, Overloaded("full", retry_after=1), attempt=0, after_lost_response=False) is None  # fmt: skip
