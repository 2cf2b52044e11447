"""Tracing is configured by OpenTelemetry's own environment variables: off without an endpoint (the SDK then not
even imported), refused at start-up in one line when it asks for what this server cannot send; and the parts
the request path calls (the observer that feeds the trace, the sampling attributes)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from txl.sampling import SamplingParams
from txl_server.sessions.observer import SessionObserver
from txl_server.telemetry.observer import TracedSessions
from txl_server.telemetry.spans import sampling_attributes
from txl_server.telemetry.tracing import config_problem, wanted

from tests.helpers.server_process import REPO

OTEL = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
)


@pytest.fixture
def environ(monkeypatch):
    for name in OTEL:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_traces_are_wanted_only_with_an_endpoint_and_not_turned_off(environ):
    assert not wanted()
    environ.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert wanted() and config_problem() is None
    environ.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not wanted()
    environ.delenv("OTEL_TRACES_EXPORTER")
    environ.setenv("OTEL_SDK_DISABLED", "true")
    assert not wanted()
    environ.delenv("OTEL_SDK_DISABLED")
    environ.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    environ.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/v1/traces")
    assert wanted()


def test_a_protocol_or_exporter_it_cannot_send_is_a_problem_named_in_one_line(environ):
    environ.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    environ.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    problem = config_problem()
    assert problem is not None and "grpc" in problem and "http/protobuf" in problem and "\n" not in problem
    environ.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")  # the traces' own setting wins
    assert config_problem() is None
    environ.setenv("OTEL_TRACES_EXPORTER", "console")
    assert "console" in (config_problem() or "")
    environ.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    assert config_problem() is None  # no traces asked for: nothing to refuse


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("OTEL_", "TXL_"))}
    return subprocess.run(
        [sys.executable, *code.split(" ", 1)] if code.startswith("-m") else [sys.executable, "-c", code],
        env={**clean, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_server_refuses_to_start_with_a_protocol_it_cannot_send(tmp_path):
    done = _run(
        "-m txl_server",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4317",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        TXL_EPHEMERAL="1",
        TXL_PORT="1",
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("cannot trace: OTEL_EXPORTER_OTLP_PROTOCOL=grpc")


def test_without_an_endpoint_the_app_does_not_import_the_tracing_sdk(tmp_path):
    # (redis-py imports the SDK's metrics module when it is installed, for its own opt-in metrics.)
    code = (
        "import sys\n"
        "from txl_server.api.app import create_app\n"
        "from txl_server.settings import Settings\n"
        "app = create_app(Settings(ephemeral=True))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk.trace', 'opentelemetry.exporter'))))\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_traced_observer_passes_every_hook_on():
    """Every hook of SessionObserver, those added after this test was written too, reaches the metrics."""
    hooks = [n for n, _ in inspect.getmembers(SessionObserver, inspect.isfunction) if not n.startswith("_")]
    calls: list[tuple] = []

    class Recording(SessionObserver):
        def __getattribute__(self, name):
            if name in hooks:
                return lambda *args: calls.append((name, *args))
            return object.__getattribute__(self, name)

    observer = TracedSessions(Recording())
    expected = []
    for name in hooks:
        arguments = tuple(range(len(inspect.signature(getattr(SessionObserver, name)).parameters) - 1))
        getattr(observer, name)(*arguments)
        expected.append((name, *arguments))
    assert len(hooks) >= 4 and calls == expected


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(temperature=0), "greedy"),
        (SamplingParams(temperature=0.7), "random"),
        (SamplingParams(top_k=40), "top_k"),
        (SamplingParams(top_p=0.9), "top_p"),
        (SamplingParams(top_k=40, top_p=0.9, seed=7), "top_k+top_p"),
    ],
)
def test_the_sampling_class_and_its_parameters(params, expected):
    attributes = sampling_attributes(params, 16)
    assert attributes["txl.sampling.class"] == expected
    assert attributes["gen_ai.request.temperature"] == params.temperature
    assert attributes["gen_ai.request.max_tokens"] == 16
    assert ("gen_ai.request.top_k" in attributes) == (params.top_k > 0)
    assert ("gen_ai.request.top_p" in attributes) == (params.top_p < 1)
    assert attributes.get("gen_ai.request.seed") == params.seed
