"""schemathesis against the server's own OpenAPI document, as a user would run it (its CLI), on a live server with an
API key, a chat template and small limits.

Every operation, with a fixed seed and budget, through schemathesis' example, coverage and fuzzing phases, valid
requests and invalid ones, with all of its checks: no server error, every response in its documented schema,
status, content type and headers, invalid requests refused, a missing key refused, unknown methods answered 405
with `Allow`; and every schema-valid request accepted but for the few refusals a schema cannot express, listed
with their reasons in `schema_fuzz_hooks.ALLOWED` (whose check replaces schemathesis' `positive_data_acceptance`).

The operations that name a session, a memory, a response or the model get real ones (fresh ones for the DELETEs),
so that they reach more than the 404 of an id that names nothing. The run's counts go to the reliability figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from .conftest import API_LIMITS, KEY_D
from .schema_fuzz_hooks import ALLOWED
from .servers import REPO

pytestmark = pytest.mark.slow

SEED = 1
EXAMPLES = int(os.environ.get("TXL_FUZZ_EXAMPLES", "25"))  # per operation and phase
# Statuses an invalid request may get: schemathesis' own, and this server's 413 for a text over its limit.
REJECTIONS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]


@pytest.fixture
def fuzz_server(make_server):
    return make_server(TXL_API_KEYS=KEY_D, TXL_CHAT_TEMPLATE="transcript", **API_LIMITS)


def test_schemathesis_finds_nothing_on_any_operation(fuzz_server, figures, tmp_path):
    with fuzz_server.client(KEY_D) as http:
        ids = {"model": http.get("/v1/models").json()["data"][0]["id"]}
        for kind in ("kept", "deleted"):
            session = http.post("/v1/sessions", json={"text": "fuzz target"}).json()
            memory = http.post("/v1/memories", json={"text": "a fuzzed document"}).json()
            response = http.post("/v1/responses", json={"input": "fuzz", "max_output_tokens": 2}).json()
            ids |= {f"{kind}:session_id": session["id"], f"{kind}:memory_id": memory["id"]}
            ids |= {f"{kind}:response_id": response["id"]}
    config = tmp_path / "schemathesis.toml"
    config.write_text(_config(ids))
    report = tmp_path / "report.json"
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run"),
        f"{fuzz_server.url}/openapi.json",
        *("--header", f"Authorization: Bearer {KEY_D}"),
        *("--checks", "all", "--exclude-checks", "positive_data_acceptance"),
        *("--phases", "examples,coverage,fuzzing", "--seed", str(SEED), "--max-examples", str(EXAMPLES)),
        *("--workers", "1", "--continue-on-failure", "--no-color", "--output-sanitize", "false"),
        *("--report", "json", "--report-json-path", str(report)),
    ]
    environment = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.reliability.schema_fuzz_hooks",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    started = time.monotonic()
    # In a directory of its own: schemathesis keeps a cache there (and replays the crashes it recorded).
    run = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    seconds = round(time.monotonic() - started, 1)
    output = run.stdout + run.stderr
    assert report.exists(), output[-5000:]
    result = json.loads(report.read_text())
    figures.record(
        "schemathesis",
        {
            "version": result["schemathesis_version"],
            "seed": SEED,
            "examples_per_operation": EXAMPLES,
            "operations": result["operations"]["tested"],
            "cases": result["test_cases"]["generated"],
            "failing_cases": result["test_cases"]["with_failures"],
            "failures": {failure["title"]: failure["operations"] for failure in result["failures"]},
            "allowed_refusals": [refusal.reason for refusal in ALLOWED],
            "seconds": seconds,
        },
    )
    assert result["operations"]["tested"] == result["operations"]["total"], output[-5000:]
    assert run.returncode == 0 and not result["failures"] and not result["errors"], output[-20000:]


def _config(ids: dict[str, str]) -> str:
    """schemathesis' configuration: the rejections' statuses, and the real ids (fresh ones for deletions)."""
    lines = [
        "[checks.negative_data_rejection]",
        f"expected-statuses = {json.dumps(REJECTIONS)}",
        "",
        "[parameters]",
        f'"path.model" = "{ids["model"]}"',
        *(f'"path.{name}" = "{ids["kept:" + name]}"' for name in ("session_id", "memory_id", "response_id")),
    ]
    for path, name in (
        ("/v1/sessions/{session_id}", "session_id"),
        ("/v1/memories/{memory_id}", "memory_id"),
        ("/v1/responses/{response_id}", "response_id"),
    ):
        lines += [
            "",
            "[[operations]]",
            f'include-name = "DELETE {path}"',
            f'parameters = {{ "path.{name}" = "{ids["deleted:" + name]}" }}',
        ]
    return "\n".join(lines) + "\n"
