"""Schemathesis against the server's own OpenAPI document, on a live server with an API key.

Each operation gets a bounded number of generated requests, valid ones (positive) and invalid ones (negative),
checked with schemathesis' `not_a_server_error` and `response_schema_conformance`. Operations with a
`{session_id}` get a real session (a fresh one per example, so DELETE can do its worst) in half the examples,
random ids in the rest. Every failure is collected, then reported together.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from .conftest import KEY_D
from .servers import error_of

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("TXL_FUZZ_EXAMPLES", "12"))  # per operation and generation mode


def test_no_operation_answers_5xx_or_breaks_its_schema(api_server, figures):
    schema = schemathesis.openapi.from_url(api_server.url + "/openapi.json")
    auth = {"Authorization": f"Bearer {KEY_D}"}
    http = requests.Session()
    http.headers.update(auth)
    statuses: Counter[int] = Counter()
    failures: dict[str, str] = {}
    calls = {"real_session": 0, "random_id": 0}
    started = time.monotonic()

    def fresh_session() -> str:
        response = http.post(api_server.url + "/v1/sessions", json={"text": "fuzz target"})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def fuzz(operation, mode: GenerationMode) -> None:
        label = f"{operation.method.upper()} {operation.path}"
        has_session = "{session_id}" in operation.path

        @given(case=operation.as_strategy(generation_mode=mode), real=st.booleans())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],  # no shrinking: failures are collected, not minimised
            suppress_health_check=list(HealthCheck),
        )
        def run(case, real) -> None:
            if has_session:
                if real:
                    case.path_parameters = {**(case.path_parameters or {}), "session_id": fresh_session()}
                calls["real_session" if real else "random_id"] += 1
            case.headers = {**(case.headers or {}), **auth}
            response = case.call(base_url=api_server.url, session=http, timeout=60)
            statuses[response.status_code] += 1
            try:
                case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
                if response.status_code >= 400:  # the documented 422 schema is FastAPI's, so check the shape
                    error_of(response)
            except AssertionError as exc:  # schemathesis' failure groups subclass AssertionError
                key = f"{label} [{mode.value}] {response.status_code}"
                failures.setdefault(key, f"{str(exc)[:800]}\n  request: {case.as_curl_command()[:400]}")

        try:
            run()
        except Unsatisfiable:  # nothing in the operation can be made invalid (e.g. GET /health)
            unsatisfiable.append(f"{label} [{mode.value}]")

    unsatisfiable: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(operation, mode)
    # Leave no fuzzing sessions behind for other tests.
    for session in http.get(api_server.url + "/v1/sessions").json().get("data", []):
        http.delete(f"{api_server.url}/v1/sessions/{session['id']}")
    figures.record(
        "schemathesis",
        {
            "version": schemathesis.SCHEMATHESIS_VERSION
            if hasattr(schemathesis, "SCHEMATHESIS_VERSION")
            else "",
            "operations": len(operations),
            "examples_per_operation_and_mode": EXAMPLES,
            "requests": sum(statuses.values()),
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "requests_on_real_sessions": calls["real_session"],
            "requests_on_random_ids": calls["random_id"],
            "operation_modes_without_cases": unsatisfiable,
            "server_errors": sum(v for k, v in statuses.items() if k >= 500),
            "failing_checks": sorted(failures),
            "seconds": round(time.monotonic() - started, 1),
        },
    )
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
