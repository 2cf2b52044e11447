"""The orchestrators wait long enough for a graceful shutdown: Kubernetes' terminationGracePeriodSeconds and
compose's stop_grace_period are the server's TXL_SHUTDOWN_GRACE_SECONDS (running requests) plus a margin to stop
the process, and docs/deploy.md says the same numbers."""

from __future__ import annotations

import re

import yaml
from txl_server.settings import Settings

from .files import DEPLOY, REPO

MARGIN_SECONDS = 10  # stopping the worker and Redis, saving what remains, the process's exit


def k8s(kind: str, name: str) -> dict:
    for path in (DEPLOY / "k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name}")


def grace_of(env: dict) -> float:
    return Settings(shutdown_grace_seconds=env.get("TXL_SHUTDOWN_GRACE_SECONDS", 20.0)).shutdown_grace_seconds


def test_kubernetes_waits_for_the_grace_period_and_the_margin():
    grace = grace_of(k8s("ConfigMap", "txl-config")["data"])
    pod = k8s("Deployment", "txl-server")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace + MARGIN_SECONDS


def test_compose_waits_for_the_grace_period_and_the_margin():
    service = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]["txl"]
    grace = grace_of(service["environment"])
    seconds = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
    assert seconds is not None and int(seconds.group(1)) == grace + MARGIN_SECONDS


def test_the_deployment_docs_give_the_same_numbers():
    docs = (REPO / "docs" / "deploy.md").read_text()
    grace = grace_of(k8s("ConfigMap", "txl-config")["data"])
    period = k8s("Deployment", "txl-server")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert f"`TXL_SHUTDOWN_GRACE_SECONDS` ({grace:g} s)" in docs
    assert f"`terminationGracePeriodSeconds: {period}`" in docs
    assert f"`stop_grace_period: {period}s`" in docs
