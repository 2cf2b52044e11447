"""Prometheus scrapes the server; Grafana's provisioning finds Prometheus and the dashboard; every metric and
label the dashboard queries exists in txl_server.metrics."""

from __future__ import annotations

import json
import re
from functools import cache

import yaml
from prometheus_client.metrics import MetricWrapperBase
from txl_server.metrics import Metrics

from .files import DEPLOY

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "txl.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
# Labels Prometheus adds to every scraped series, and the histogram bucket bound.
TARGET_LABELS = {"instance", "job", "le"}


@cache
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def compose_mount(service: str, source: str) -> str:
    for volume in compose()["services"][service]["volumes"]:
        src, target = volume.split(":")[:2]
        if src == source:
            return target
    raise KeyError(source)


@cache
def exported() -> dict[str, set[str]]:
    """Every series name the server exports (with the client library's suffixes) -> its label names."""
    metrics = Metrics()
    series: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for suffix in SUFFIXES[family.type]:
            series[family.name + suffix] = set()
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            for suffix in SUFFIXES[metric._type]:
                series[metric._name + suffix] = set(metric._labelnames)
    return series


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions() -> list[tuple[str, str]]:
    return [(panel["title"], t["expr"]) for panel in dashboard()["panels"] for t in panel["targets"]]


def test_prometheus_scrapes_the_server_metrics_endpoint():
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert compose_mount("prometheus", "./prometheus/prometheus.yml") == "/etc/prometheus/prometheus.yml"
    server = compose()["services"]["txl"]
    port = server["environment"]["TXL_PORT"]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "txl"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert f"txl:{port}" in targets


def test_grafana_provisions_the_prometheus_datasource_and_the_dashboard():
    base = DEPLOY / "grafana" / "provisioning"
    assert compose_mount("grafana", "./grafana/provisioning") == "/etc/grafana/provisioning"
    (source,) = yaml.safe_load((base / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "prometheus" in compose()["services"]
    (provider,) = yaml.safe_load((base / "dashboards" / "txl.yml").read_text())["providers"]
    assert provider["options"]["path"] == compose_mount("grafana", "./grafana/dashboards")
    uids = {p["datasource"]["uid"] for p in dashboard()["panels"]}
    assert uids == {source["uid"]}


def test_dashboard_json_is_well_formed():
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for panel in board["panels"]:
        assert panel["targets"] and panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        g = panel["gridPos"]
        covered = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        assert g["x"] + g["w"] <= 24
        cells |= covered


def test_every_queried_metric_and_label_exists():
    series = exported()
    for title, expr in expressions():
        names = re.findall(r"\btxl_[a-z_]+\b", expr)
        assert names, f"{title}: {expr}"
        labels = set(TARGET_LABELS)
        for name in names:
            assert name in series, f"{title}: {name} is not exported by txl_server.metrics"
            labels |= series[name]
        used = set()
        for group in re.findall(r"\bby \(([^)]*)\)", expr):
            used |= {label.strip() for label in group.split(",")}
        used |= set(re.findall(r"(\w+)\s*=~?\s*\"", expr))
        assert used <= labels, f"{title}: unknown labels {used - labels} in {expr}"
        if "histogram_quantile" in expr:
            assert re.search(r"by \(le\b", expr) and "_bucket" in expr, f"{title}: {expr}"


def test_dashboard_covers_the_serving_signals():
    queried = {name for _, expr in expressions() for name in re.findall(r"\btxl_[a-z_]+\b", expr)}
    assert {
        "txl_requests_total",
        "txl_time_to_first_token_seconds_bucket",
        "txl_inter_token_latency_seconds_bucket",
        "txl_tokens_total",
        "txl_queue_depth",
        "txl_batch_size_bucket",
        "txl_sessions",
        "txl_memory_bytes",
        "txl_memory_budget_bytes",
        "txl_evictions_total",
        "txl_restores_total",
        "txl_conflicts_total",
        "txl_cancellations_total",
        "txl_overloaded_total",
    } <= queried
