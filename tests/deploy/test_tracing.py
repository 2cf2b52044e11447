"""Traces in the deployments: compose's OpenTelemetry Collector (the `tracing` profile, off by default) and its
configuration, the server's OTEL_* variables in compose and in the Kubernetes ConfigMap: each one a variable the
SDK knows, off without an endpoint, and with one an endpoint the server can send to (OTLP/HTTP, which the
collector takes on the port the endpoint names)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import yaml
from opentelemetry.sdk import environment_variables
from txl_server.settings import Settings
from txl_server.telemetry.tracing import config_problem, wanted

from .files import DEPLOY, interpolate
from .test_compose import DUMMY_ENV, compose, raw
from .test_k8s import find

COLLECTOR = DEPLOY / "otel-collector" / "config.yaml"
KNOWN = {name for name in dir(environment_variables) if name.startswith("OTEL_")}


def otel_of(env: dict[str, str]) -> dict[str, str]:
    return {k: str(v) for k, v in env.items() if k.startswith("OTEL_")}


def traced_as(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> bool:
    """Whether a server with exactly these OTEL_* variables traces (raising if it would refuse to start)."""
    for name in KNOWN:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert config_problem() is None
    return wanted()


def collector() -> dict:
    return yaml.safe_load(COLLECTOR.read_text())


def test_the_collector_takes_otlp_http_and_every_component_it_names_is_defined():
    config = collector()
    endpoint = config["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert endpoint == "0.0.0.0:4318"
    assert "grpc" not in config["receivers"]["otlp"]["protocols"]  # the server sends http/protobuf only
    (pipeline,) = config["service"]["pipelines"].items()
    name, stages = pipeline
    assert name == "traces" and stages["receivers"] == ["otlp"]
    for kind in ("receivers", "processors", "exporters"):
        for component in stages.get(kind, []):
            assert component in config[kind], f"{kind}: {component} is not defined"


def test_compose_runs_the_collector_only_with_the_tracing_profile():
    services = compose()["services"]
    service = services["otel-collector"]
    assert service["profiles"] == ["tracing"]
    assert [p for p in service["ports"] if str(p).endswith(":4318")]
    source, target = service["volumes"][0].split(":")[:2]
    assert (DEPLOY / source).resolve() == COLLECTOR.resolve()
    assert service["command"] == [f"--config={target}"]
    assert not [s for name, s in services.items() if name != "otel-collector" and s.get("profiles")]


def test_compose_traces_nothing_by_default_and_to_the_collector_when_asked(monkeypatch):
    env = otel_of(compose()["services"]["txl"]["environment"])
    assert env.keys() <= KNOWN, env.keys() - KNOWN
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "" and not traced_as(monkeypatch, env)
    asked = {**DUMMY_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4318"}
    document = interpolate(raw(), asked)
    env = otel_of(document["services"]["txl"]["environment"])
    assert traced_as(monkeypatch, env)
    url = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert url.hostname in document["services"]  # a service of this file
    assert url.port == int(
        collector()["receivers"]["otlp"]["protocols"]["http"]["endpoint"].rpartition(":")[2]
    )
    assert (
        env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
        and float(env["OTEL_TRACES_SAMPLER_ARG"]) == 1
    )


def test_kubernetes_sets_json_logs_and_known_otel_variables_without_an_endpoint(monkeypatch):
    config = find("ConfigMap", "txl-config")["data"]
    assert Settings(log_format=config["TXL_LOG_FORMAT"]).log_format == "json"
    env = otel_of(config)
    assert env and env.keys() <= KNOWN, env.keys() - KNOWN
    assert not traced_as(monkeypatch, env)  # until the operator names a collector
    assert "# OTEL_EXPORTER_OTLP_ENDPOINT: http://" in (DEPLOY / "k8s" / "config.yaml").read_text()
    assert traced_as(monkeypatch, {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4318"})
