"""Reliability suite fixtures: real server processes (on the session fixtures' tiny model and real Redis), and the
figures file.

Every test that measures something records it with `figures.record(section, {...})`; at the end of the run the
figures are merged into `artifacts/reliability.json` (override with TXL_RELIABILITY_JSON), from which
`python tests/reliability/report.py` renders docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.server_process import REPO, ServerProcess, process_env

# Long keys, so that "a wrong key sharing a long prefix with a real one" means something in the timing test.
KEY_A = "txl-a-" + secrets.token_hex(28)
KEY_B = "txl-b-" + secrets.token_hex(28)
KEY_C = "txl-c-" + secrets.token_hex(28)  # a third tenant for hostile input, which must not spoil the others
KEY_D = "txl-d-" + secrets.token_hex(28)  # schemathesis' tenant

# Limits of the shared API server: small, so that limit checks are cheap to reach.
API_LIMITS = {
    "TXL_MAX_BODY_BYTES": str(64 * 1024),
    "TXL_MAX_TEXT_CHARS": str(8 * 1024),
    "TXL_MAX_TOKENS": "64",
    "TXL_MAX_STOP_STRINGS": "2",
    "TXL_MAX_STOP_CHARS": "8",
    "TXL_MAX_METADATA_BYTES": "512",
    "TXL_MAX_CONCURRENT_REQUESTS": "24",
    "TXL_MAX_SESSIONS_PER_TENANT": "400",
}


class Figures:
    """Measured figures by section, merged into the JSON file at the end of the run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sections: dict[str, dict[str, Any]] = {}

    def record(self, section: str, values: dict[str, Any]) -> None:
        self.sections.setdefault(section, {}).update(values)

    def write(self, suite: dict[str, Any], outcomes: dict[str, Any]) -> None:
        existing: dict[str, Any] = {}
        if self.path.exists():
            try:
                existing = json.loads(self.path.read_text())
            except ValueError:
                existing = {}
        sections = {**existing.get("sections", {}), **self.sections}
        tests = {**existing.get("tests", {}), **outcomes}
        document = {"machine": machine(), "suite": suite, "sections": sections, "tests": tests}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def machine() -> dict[str, Any]:
    cpu = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = ""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        memory = meminfo.read_text().splitlines()[0].split(":", 1)[1].strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": memory,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


OUTCOMES: dict[str, dict[str, Any]] = {}  # test id -> outcome and seconds, for the report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if "reliability" in item.nodeid and (report.when == "call" or report.outcome != "passed"):
        name = item.nodeid.split("reliability/", 1)[-1]
        entry = OUTCOMES.setdefault(name, {"outcome": report.outcome, "seconds": 0.0})
        if report.outcome != "passed":
            entry["outcome"] = report.outcome
        entry["seconds"] = round(entry["seconds"] + report.duration, 1)
    return report


@pytest.fixture(scope="session", autouse=True)
def figures(request) -> Any:
    path = Path(os.environ.get("TXL_RELIABILITY_JSON", REPO / "artifacts" / "reliability.json"))
    recorder = Figures(path)
    started = time.monotonic()
    yield recorder
    session = request.session
    recorder.write(
        {
            "finished_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": round(time.monotonic() - started, 1),
            "tests_collected": session.testscollected,
            "tests_failed": session.testsfailed,
            "load_seconds_setting": int(os.environ.get("TXL_LOAD_SECONDS", "60")),
        },
        OUTCOMES,
    )


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture
def make_server(tiny_model_dir, redis_server, logs_dir):
    """Starts server processes on the shared Redis (a fresh key prefix each) and stops them after the test."""
    started: list[ServerProcess] = []

    def make(**env: str) -> ServerProcess:
        values = {**process_env(tiny_model_dir, redis_server.url, "rel"), **env}
        server = ServerProcess(logs_dir / f"server-{uuid.uuid4().hex[:8]}.log", **values)
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def api_server(tiny_model_dir, redis_server, logs_dir):
    """One server with four tenants (KEY_A to KEY_D) and small limits, shared by the functional tests."""
    server = ServerProcess(
        logs_dir / "api-server.log",
        **process_env(tiny_model_dir, redis_server.url, "api"),
        TXL_API_KEYS=f"{KEY_A},{KEY_B},{KEY_C},{KEY_D}",
        **API_LIMITS,
    )
    with server:
        yield server


@pytest.fixture
def a(api_server):
    with api_server.client(KEY_A) as client:
        yield client


@pytest.fixture
def b(api_server):
    with api_server.client(KEY_B) as client:
        yield client


@pytest.fixture
def c(api_server):
    with api_server.client(KEY_C) as client:
        yield client
