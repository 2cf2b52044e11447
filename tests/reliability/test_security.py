"""Tenants, keys, session ids, unpickling, and what reaches logs and /metrics."""

from __future__ import annotations

import ast
import itertools
import math
import re
import secrets
import statistics
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.helpers.metrics import metric
from tests.helpers.server_process import REPO
from tests.helpers.sse import sse_payloads

from .conftest import KEY_A
from .servers import OPENAI_ROUTES, error_of

# ---------------------------------------------------------------------------------------------- tenants


def test_every_session_route_is_isolated_between_tenants(a, b):
    session = a.post("/v1/sessions", json={"text": "tenant A's secret", "metadata": {"owner": "a"}}).json()
    sid = session["id"]
    key = {"Idempotency-Key": "shared-" + uuid.uuid4().hex}
    assert a.post(f"/v1/sessions/{sid}/append", json={"text": " more"}, headers=key).status_code == 200
    session = a.get(f"/v1/sessions/{sid}").json()
    attempts = [
        ("GET", f"/v1/sessions/{sid}", None, {}),
        ("DELETE", f"/v1/sessions/{sid}", None, {}),
        ("POST", f"/v1/sessions/{sid}/fork", None, {}),
        ("POST", f"/v1/sessions/{sid}/fork", {"metadata": {"x": 1}}, {}),
        ("POST", f"/v1/sessions/{sid}/append", {"text": "x"}, {}),
        ("POST", f"/v1/sessions/{sid}/append", {"text": " more"}, key),  # A's idempotency key: no replay
        ("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 2}, {}),
        ("POST", f"/v1/sessions/{sid}/generate", {"max_tokens": 2, "stream": True}, {}),
        ("GET", f"/v1/sessions/{sid}/snapshot", None, {}),
        ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1, "session_id": sid}, {}),
        ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1, "session_id": sid, "stream": True}, {}),
    ]
    for method, path, body, headers in attempts:
        response = b.request(method, path, json=body, headers=headers)
        assert response.status_code == 404, (method, path, response.status_code, response.text)
        error = error_of(response)
        assert error.get("code", error["type"]) == "not_found" and "secret" not in response.text, (
            method,
            path,
        )
    assert sid not in [s["id"] for s in b.get("/v1/sessions").json()["data"]]
    assert sid in [s["id"] for s in a.get("/v1/sessions").json()["data"]]
    # Nothing B tried changed A's session; A still has every right.
    assert a.get(f"/v1/sessions/{sid}").json() == session
    exported = a.get(f"/v1/sessions/{sid}/snapshot")
    assert exported.status_code == 200
    # A snapshot imported by B is B's own new session (a copy), never a handle on A's.
    imported = b.post(
        "/v1/sessions/import", content=exported.content, headers={"Content-Type": "application/octet-stream"}
    ).json()
    assert imported["id"] != sid and a.get(f"/v1/sessions/{imported['id']}").status_code == 404
    assert b.delete(f"/v1/sessions/{imported['id']}").status_code == 204
    assert a.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_busy_foreign_session_is_404_not_409(a, b, api_server):
    """While A's session is busy, B must not learn that it exists (404 before 409)."""
    sid = a.post("/v1/sessions", json={"text": "busy"}).json()["id"]
    result: dict[str, httpx.Response] = {}

    def long_append() -> None:
        with api_server.client(KEY_A) as client:
            result["a"] = client.post(f"/v1/sessions/{sid}/append", json={"text": "z" * 8000})

    prefill_steps = metric(a.get("/metrics").text, "txl_prefill_step_seconds_count")
    thread = threading.Thread(target=long_append)
    thread.start()
    seen_busy = False
    try:
        deadline = time.monotonic() + 20
        while thread.is_alive() and time.monotonic() < deadline and not seen_busy:
            # Probe only once the long append is being ingested (its segments count up), or we would take its
            # lease ourselves.
            if metric(a.get("/metrics").text, "txl_prefill_step_seconds_count") < prefill_steps + 3:
                time.sleep(0.01)
                continue
            theirs = b.post(f"/v1/sessions/{sid}/append", json={"text": "."})
            assert theirs.status_code == 404, theirs.text
            # The owner may wait for its turn (TXL_LEASE_WAIT_SECONDS) and step, or be told it is busy.
            mine = a.post(f"/v1/sessions/{sid}/append", json={"text": "."})
            assert mine.status_code in (200, 409), mine.text
            seen_busy = True
    finally:
        thread.join()
    assert result["a"].status_code == 200, result["a"].text
    assert seen_busy, "the long append ended before a conflict could be observed"


def test_missing_malformed_and_wrong_keys_are_401_on_every_v1_route(api_server):
    routes = [
        ("GET", "/v1/sessions"),
        ("POST", "/v1/sessions"),
        ("GET", "/v1/sessions/x"),
        ("DELETE", "/v1/sessions/x"),
        ("POST", "/v1/sessions/x/fork"),
        ("POST", "/v1/sessions/x/append"),
        ("POST", "/v1/sessions/x/generate"),
        ("GET", "/v1/sessions/x/snapshot"),
        ("POST", "/v1/sessions/import"),
        ("POST", "/v1/score"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/models"),
    ]
    headers = [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer x y"},
        {"Authorization": KEY_A},  # no scheme
        {"Authorization": f"Basic {KEY_A}"},
        {"Authorization": f"Bearer {KEY_A[:-1]}"},
        {"Authorization": f"Bearer {KEY_A}x"},
        {"Authorization": f"Bearer {KEY_A.upper()}"},
    ]
    with httpx.Client(base_url=api_server.url, timeout=30) as client:
        for method, path in routes:
            for header in headers:
                response = client.request(method, path, headers=header, json={})
                assert response.status_code == 401, (method, path, header, response.text)
                error = error_of(response)
                kind = error["code"] if path in OPENAI_ROUTES else error["type"]  # OpenAI's code for a 401
                assert kind == ("invalid_api_key" if path in OPENAI_ROUTES else "unauthorized")
                assert KEY_A not in response.text


@pytest.mark.slow
def test_wrong_keys_take_the_same_time_whatever_they_share_with_a_real_key(api_server, figures):
    """A key sharing all but its last character with a real key is refused as fast as an unrelated one."""
    near = KEY_A[:-1] + ("0" if KEY_A[-1] != "0" else "1")
    far = "zz-" + secrets.token_hex(len(KEY_A) // 2)[: len(KEY_A) - 3]
    assert len(near) == len(far) == len(KEY_A)
    rounds, warmup = 300, 30
    times: dict[str, list[float]] = {"near": [], "far": []}
    with httpx.Client(base_url=api_server.url, timeout=30) as client:
        for i in range(warmup + rounds):
            # Alternate the order within each pair, so that drift and caching hit both kinds alike.
            pair = [("near", near), ("far", far)] if i % 2 == 0 else [("far", far), ("near", near)]
            for name, key in pair:
                started = time.perf_counter()
                response = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
                elapsed = time.perf_counter() - started
                assert response.status_code == 401
                if i >= warmup:
                    times[name].append(elapsed)
    medians = {name: statistics.median(values) for name, values in times.items()}
    spread = {
        name: statistics.quantiles(values, n=4)[2] - statistics.quantiles(values, n=4)[0]
        for name, values in times.items()
    }
    difference = abs(medians["near"] - medians["far"])
    figures.record(
        "key_timing",
        {
            "requests_each": rounds,
            "median_ms_shared_prefix": round(medians["near"] * 1e3, 4),
            "median_ms_unrelated": round(medians["far"] * 1e3, 4),
            "median_difference_ms": round(difference * 1e3, 4),
            "iqr_ms_shared_prefix": round(spread["near"] * 1e3, 4),
            "iqr_ms_unrelated": round(spread["far"] * 1e3, 4),
            "key_length": len(KEY_A),
            "shared_prefix_chars": len(KEY_A) - 1,
        },
    )
    assert difference < 1e-3, medians


# ---------------------------------------------------------------------------------------------- ids


def test_session_ids_carry_at_least_128_random_bits(b, figures):
    ids = []
    parent = b.post("/v1/sessions", json={}).json()["id"]
    ids.append(parent)
    for i in range(150):
        ids.append(b.post("/v1/sessions", json={}).json()["id"])
        if i % 10 == 0:
            ids.append(b.post(f"/v1/sessions/{parent}/fork").json()["id"])
    try:
        assert len(set(ids)) == len(ids), "duplicate session ids"
        alphabet = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        lengths = {len(i) for i in ids}
        assert all(set(i) <= alphabet for i in ids), "ids are not url-safe base64"
        assert not any(i.startswith("-") for i in ids), "an id a command line would take for an option"
        bits = min(lengths) * math.log2(len(alphabet))
        assert bits >= 128, f"ids of {min(lengths)} characters hold at most {bits:.0f} bits"
        # Random, not counters or clocks: every position takes many values, and ids share no long prefix.
        per_position = [len({i[p] for i in ids}) for p in range(min(lengths))]
        assert min(per_position) >= 40, per_position
        ordered = sorted(ids)
        longest_prefix = max(len(_common_prefix(x, y)) for x, y in itertools.pairwise(ordered))
        assert longest_prefix <= 5, longest_prefix
        figures.record(
            "session_ids",
            {
                "ids": len(ids),
                "distinct": len(set(ids)),
                "length": sorted(lengths),
                "max_bits": round(bits),
                "min_distinct_symbols_per_position": min(per_position),
                "longest_shared_prefix": longest_prefix,
            },
        )
    finally:
        for sid in ids:
            b.delete(f"/v1/sessions/{sid}")


def _common_prefix(x: str, y: str) -> str:
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return x[:n]


# ---------------------------------------------------------------------------------------------- unpickling

ALLOWED_UNPICKLER = (Path("model/txl/tokenizers/vocab_pickle.py"), "RestrictedUnpickler")


def _python_files() -> list[Path]:
    files = []
    for top in ("model", "server", "clients"):
        files += [p for p in (REPO / top).rglob("*.py") if ".venv" not in p.parts]
    assert len(files) > 20
    return files


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _unsafe_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases: dict[str, str] = {}  # local name -> module or module.attr it stands for
    problems = []
    rel = path.relative_to(REPO)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    dangerous = {
        "pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads",
        "cPickle.load", "cPickle.loads", "dill.load", "dill.loads", "joblib.load", "marshal.loads",
        "shelve.open", "pandas.read_pickle",
    }  # fmt: skip

    def resolve(name: str) -> str:
        head, _, rest = name.partition(".")
        full = aliases.get(head, head)
        return f"{full}.{rest}" if rest else full

    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                unpickler = resolve(_dotted(base)) in ("pickle.Unpickler", "_pickle.Unpickler")
                if unpickler and (rel, node.name) != ALLOWED_UNPICKLER:
                    problems.append(f"{rel}:{node.lineno}: {node.name} subclasses pickle.Unpickler")
        if not isinstance(node, ast.Call):
            continue
        name = resolve(_dotted(node.func))
        keywords = {k.arg: k.value for k in node.keywords}
        if name in dangerous:
            problems.append(f"{rel}:{node.lineno}: {name}()")
        elif name == "torch.load":
            weights_only = keywords.get("weights_only")
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                problems.append(f"{rel}:{node.lineno}: torch.load() without weights_only=True")
        elif name in ("numpy.load", "np.load"):
            allow = keywords.get("allow_pickle")
            if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
                problems.append(f"{rel}:{node.lineno}: numpy.load(allow_pickle=...)")
        elif name.endswith(".load") and name.split(".")[0] == "torch":
            problems.append(f"{rel}:{node.lineno}: {name}()")
    return problems


def test_nothing_unpickles_untrusted_input():
    files = _python_files()
    problems = [p for path in files for p in _unsafe_calls(path)]
    assert not problems, "\n".join(problems)
    # The analysis does find what it looks for.
    probe = REPO / "artifacts" / "unpickle_probe.py"
    probe.parent.mkdir(exist_ok=True)
    probe.write_text(
        "import pickle as p\nimport torch\nfrom pickle import loads\n"
        "class U(p.Unpickler): pass\n"
        "p.load(f)\nloads(b)\ntorch.load('x')\ntorch.load('x', weights_only=False)\n"
        "torch.load('x', weights_only=True)\n"
    )
    try:
        found = _unsafe_calls(probe)
    finally:
        probe.unlink()
    assert len(found) == 5, found
    # The one restricted unpickler exists, and nothing that serves requests can reach it (the client CLI's
    # `txl convert` uses it on a file its user names, which is the one intended use).
    vocab_pickle = (REPO / ALLOWED_UNPICKLER[0]).read_text()
    assert f"class {ALLOWED_UNPICKLER[1]}(pickle.Unpickler)" in vocab_pickle
    assert "def find_class" in vocab_pickle
    for path in files:
        rel = path.relative_to(REPO)
        if rel.parts[0] == "server":
            text = path.read_text()
            for name in ("vocab_pickle", "convert_hf_vocab", "read_hf_vocab"):
                assert name not in text, f"{rel} references {name}"


# ---------------------------------------------------------------------------------------------- logs, metrics


def _exercise_every_text_route(server, marker: str) -> list[str]:
    """Sends `marker` through every route that takes user text; returns the session ids made."""
    ids = []
    with server.client() as client:
        session = client.post("/v1/sessions", json={"text": marker, "metadata": {"note": marker}}).json()
        ids.append(session["id"])
        assert client.post(f"/v1/sessions/{session['id']}/append", json={"text": marker}).status_code == 200
        assert (
            client.post(
                f"/v1/sessions/{session['id']}/generate", json={"text": marker, "max_tokens": 3}
            ).status_code
            == 200
        )
        with client.stream(
            "POST",
            f"/v1/sessions/{session['id']}/generate",
            json={"text": marker, "max_tokens": 3, "stream": True, "stop": [marker[:8]]},
        ) as response:
            assert sse_payloads(list(response.iter_lines()))[-1] == "[DONE]"
        for body in (
            {"prompt": marker, "max_tokens": 3},
            {"prompt": [marker, marker], "max_tokens": 2, "stream": True},
            {"prompt": marker, "max_tokens": 0, "echo": True, "logprobs": 1},
            {"prompt": marker, "max_tokens": 2, "session_id": session["id"]},
        ):
            assert client.post("/v1/completions", json=body).status_code == 200
        assert client.post("/v1/score", json={"text": marker}).status_code == 200
        plain = client.post("/v1/score", content=marker.encode(), headers={"Content-Type": "text/plain"})
        assert plain.status_code == 200
        fork = client.post(f"/v1/sessions/{session['id']}/fork", json={"metadata": {"note": marker}}).json()
        ids.append(fork["id"])
        # Refused requests too: their error messages must not carry the text into the logs either.
        client.post(f"/v1/sessions/{session['id']}/append", json={"text": marker, "bogus": marker})
        client.post("/v1/completions", json={"prompt": marker, "model": "nope"})
    return ids


@pytest.mark.slow
def test_prompts_reach_the_logs_only_when_the_operator_opts_in(make_server):
    marker = "zq-" + secrets.token_hex(10) + "-prompt"
    quiet = make_server(TXL_LOG_LEVEL="debug")
    ids = _exercise_every_text_route(quiet, marker)
    quiet.stop()
    log = quiet.log()
    assert "DEBUG" in log or "debug" in log.lower(), "the server did not log at debug level"
    assert marker not in log and marker[3:23] not in log, "a prompt reached the logs at debug level"
    assert len(log.splitlines()) > 5
    assert ids

    loud = make_server(TXL_LOG_LEVEL="info", TXL_LOG_PROMPTS="true")
    _exercise_every_text_route(loud, marker)
    loud.stop()
    assert marker in loud.log(), "TXL_LOG_PROMPTS=true did not log the prompt"


def test_metrics_carry_no_user_text_or_session_ids(api_server, a):
    marker = "mq-" + secrets.token_hex(8)
    session = a.post("/v1/sessions", json={"text": marker, "metadata": {marker: marker}}).json()
    a.post(f"/v1/sessions/{session['id']}/generate", json={"text": marker, "max_tokens": 2})
    a.get(f"/v1/sessions/{marker}")
    a.get(f"/{marker}")
    a.post(f"/v1/sessions/{session['id']}/{marker}", json={})
    a.post("/v1/completions", json={"prompt": marker, "max_tokens": 1, "user": marker})
    text = a.get("/metrics").text
    assert marker not in text and session["id"] not in text
    assert metric(text, "txl_requests_total", route="unmatched", method="GET", status="404") >= 1
    # Every route label is a route template (or "unmatched"), never a concrete path.
    templates = set(api_server.client().get("/openapi.json").json()["paths"]) | {"/", "unmatched"}
    routes = set(re.findall(r'route="([^"]*)"', text))
    assert routes and routes <= templates | {"/openapi.json", "/docs", "/redoc"}, routes - templates
    a.delete(f"/v1/sessions/{session['id']}")
