"""Graceful shutdown of a real server process (SIGTERM/SIGINT) with streams in flight: no new requests (503
`server_shutting_down`), running ones finish within TXL_SHUTDOWN_GRACE_SECONDS, those still open then end with an
`error` event and `[DONE]` and commit nothing, and the process exits 0 without a traceback."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from tests.helpers.server_process import ServerProcess, standalone

pytestmark = pytest.mark.timeout(300)

# Far longer than any grace period here, even on a fast machine (the tiny model makes thousands of tokens a second).
LONG = {"max_tokens": 200_000, "stream": True}
LIMITS = {"TXL_MAX_TOKENS": "200000"}
SHORT = {"max_tokens": 200, "stream": True, "temperature": 0}


class Stream(threading.Thread):
    """A generation stream read in the background: its `data:` payloads, and whether the first token came."""

    def __init__(self, url: str, path: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.body = url, path, body
        self.events: list[str] = []
        self.first = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + self.path, json=self.body, timeout=120) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line.removeprefix("data: "))
                        self.first.set()
        except Exception as exc:  # reported by the test
            self.error = exc
        finally:
            self.first.set()

    def payloads(self) -> list[dict]:
        assert self.events and self.events[-1] == "[DONE]", self.events[-3:]
        return [json.loads(event) for event in self.events[:-1]]


def start_stream(server: ServerProcess, client: httpx.Client, body: dict) -> tuple[dict, Stream]:
    session = client.post("/v1/sessions", json={"text": "Once upon a time"}).json()
    stream = Stream(server.url, f"/v1/sessions/{session['id']}/generate", body)
    stream.start()
    assert stream.first.wait(60) and stream.error is None
    return session, stream


def test_a_shutdown_lets_steps_finish_then_ends_open_streams_and_commits_nothing_half_done(
    tiny_model_dir, tmp_path
):
    server = standalone(
        tiny_model_dir,
        tmp_path / "server.log",
        XDG_DATA_HOME=str(tmp_path / "data"),
        TXL_SHUTDOWN_GRACE_SECONDS="4",
        **LIMITS,
    )
    try:
        server.start()
        with server.client() as client:
            cut, long_stream = start_stream(server, client, LONG)
            finished, short_stream = start_stream(server, client, SHORT)
            started = time.monotonic()
            server.signal(signal.SIGTERM)
            time.sleep(0.5)
            refused = client.get("/v1/sessions")  # a new request on the old connection
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
            assert refused.json()["error"]["code"] == "server_shutting_down"
            assert refused.json()["error"]["type"] == "unavailable"
            short_stream.join(60)
            long_stream.join(60)
        assert server.wait(60) == 0
        took = time.monotonic() - started
        ends = short_stream.payloads()[-1]
        assert ends["type"] == "done" and ends["session"]["version"] == finished["version"] + 1  # it finished
        error = long_stream.payloads()[-1]
        assert error["type"] == "error" and error["error"]["code"] == "server_shutting_down", error
        assert 3.5 < took < 20, took  # the grace period, then the stream was ended
        log = server.log()
        assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log, log
        assert "stopped 1 requests still running at the end of the grace period (4 s)" in log, log

        server.start()  # the cut generation committed nothing; the finished one is there
        with server.client() as client:
            assert client.get(f"/v1/sessions/{cut['id']}").json()["version"] == cut["version"]
            assert client.get(f"/v1/sessions/{finished['id']}").json()["version"] == finished["version"] + 1
            step = client.post(f"/v1/sessions/{cut['id']}/append", json={"text": " again"})
            assert step.status_code == 200
        assert server.terminate() == 0
    finally:
        server.kill()


def test_a_second_ctrl_c_stops_the_running_requests_at_once(tiny_model_dir, tmp_path):
    server = standalone(
        tiny_model_dir, tmp_path / "server.log", TXL_EPHEMERAL="1", TXL_SHUTDOWN_GRACE_SECONDS="120", **LIMITS
    )
    try:
        server.start()
        with server.client() as client:
            _, stream = start_stream(server, client, LONG)
        completion = {"model": "tiny-byte", "prompt": "Once", "max_tokens": 200_000, "stream": True}
        openai_stream = Stream(server.url, "/v1/completions", completion)  # every stream ends alike
        openai_stream.start()
        assert openai_stream.first.wait(60) and openai_stream.error is None
        started = time.monotonic()
        server.signal(signal.SIGINT)
        time.sleep(1)
        assert stream.is_alive() and openai_stream.is_alive()  # waiting for them, within the grace period
        server.signal(signal.SIGINT)
        stream.join(60)
        openai_stream.join(60)
        assert server.wait(60) == 0 and time.monotonic() - started < 30
        assert stream.payloads()[-1]["error"]["code"] == "server_shutting_down"
        assert (
            openai_stream.payloads()[-1]["error"]["code"] == "server_shutting_down"
        )  # OpenAI's clients raise it
        log = server.log()
        assert "stopping the running requests now" in log and "Traceback" not in log, log
        # It says what happened: the second Ctrl-C, not the grace period, ended them.
        assert "stopped 2 requests still running at a second Ctrl-C" in log, log
        assert "at the end of the grace period" not in log, log
    finally:
        server.kill()
