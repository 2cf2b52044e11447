"""deploy/nginx without running traffic: nginx accepts the shipped configuration, the session map gives every route
the key docs/deploy.md says, and the SDK's X-TXL-Session header is what the map reads. tests/deploy/test_nginx.py
runs the same files in front of real replicas."""

from __future__ import annotations

import inspect
import re
import subprocess

import pytest
from txl_client import calls
from txl_server.api.completions.router import router as completions_router
from txl_server.api.sessions.router import router as sessions_router
from txl_server.sessions.service import SessionService, new_session_id

from .nginx import (
    MAIN,
    PROXY,
    SESSION_MAP,
    UPSTREAM,
    evaluate,
    nginx_binary,
    parse_maps,
    render_upstream,
    strip_comments,
)

SESSION_ID = "kQ2-x_9AbCdEfGhIjKlMnOpQrStUvW-_"
OTHER_ID = "Zz9-y_8BaDcFeHgJiLkNmPoRqTsVuX_-"


def session_key(
    uri: str, header: str | None = None, request_id: str = "req-1", *, session_id_header: str | None = None
) -> str:
    request = {"uri": uri, "request_id": request_id}
    if header is not None:
        request["http_x_txl_session"] = header
    if session_id_header is not None:
        request["http_x_session_id"] = session_id_header
    return evaluate(parse_maps(SESSION_MAP.read_text()), "txl_session", request)


def test_conversation_and_response_paths_hash_on_their_session():
    assert session_key(f"/v1/conversations/conv_{SESSION_ID}") == SESSION_ID
    assert session_key(f"/v1/conversations/conv_{SESSION_ID}/items/msg_1") == SESSION_ID
    assert session_key(f"/v1/responses/resp_{SESSION_ID}.12") == SESSION_ID
    assert session_key(f"/v1/responses/resp_{SESSION_ID}.12/cancel", header=OTHER_ID) == SESSION_ID
    for path in ("/v1/conversations", f"/v1/conversations/{SESSION_ID}", f"/v1/responses/resp_{SESSION_ID}"):
        assert session_key(path) == "req-1", path


def test_llm_ds_x_session_id_header_routes_like_the_sdks():
    for value in (SESSION_ID, f"conv_{SESSION_ID}", f"resp_{SESSION_ID}.3"):
        assert session_key("/v1/responses", session_id_header=value) == SESSION_ID, value
    # The SDK's header, where both are sent, and the path, where it names a session, come first.
    assert session_key("/v1/responses", header=OTHER_ID, session_id_header=SESSION_ID) == OTHER_ID
    assert session_key(f"/v1/sessions/{SESSION_ID}", session_id_header=OTHER_ID) == SESSION_ID
    for value in ("", "short", f"conv_{SESSION_ID}x", f"resp_{SESSION_ID}.x"):
        assert session_key("/v1/responses", session_id_header=value) == "req-1", value


def test_the_sdk_names_a_conversations_session():
    for conversation in (f"conv_{SESSION_ID}", {"id": f"conv_{SESSION_ID}"}):
        body = {"conversation": conversation, "input": "x"}
        assert calls.Call("POST", "/v1/responses", body).request_headers()[calls.SESSION_HEADER] == SESSION_ID


def test_every_session_route_hashes_on_its_id_and_the_others_on_the_request():
    # The map relies on the ids' form: 32 URL-safe characters.
    assert inspect.getsource(SessionService).count("id=new_session_id()") >= 1
    assert len(new_session_id()) == len(SESSION_ID) and re.fullmatch(r"[A-Za-z0-9_-]{32}", new_session_id())
    routes = {r.path for r in sessions_router.routes}
    with_id = [p for p in routes if "{session_id}" in p]
    assert with_id, routes
    for path in with_id:
        assert session_key(path.replace("{session_id}", SESSION_ID)) == SESSION_ID, path
        # The path names the session the server steps: it wins over a header that says otherwise.
        assert session_key(path.replace("{session_id}", SESSION_ID), header=OTHER_ID) == SESSION_ID, path
    for path in routes - set(with_id):  # listing, creating, importing: no id, so the request id spreads them
        assert session_key(path) == "req-1", path
    for path in ("/v1/completions", "/v1/sessions", f"/v1/sessions/{SESSION_ID}x/append", "/v1/score"):
        assert session_key(path) == "req-1", path


def test_body_addressed_requests_hash_on_the_header_the_sdk_sends():
    assert "/v1/completions" in {r.path for r in completions_router.routes}
    for body in ({"session_id": SESSION_ID}, {"previous_response_id": f"resp_{SESSION_ID}_12"}):
        header = calls.Call("POST", "/v1/completions", body).request_headers()[calls.SESSION_HEADER]
        assert session_key("/v1/completions", header=header) == SESSION_ID
    # Anything else in the header is not a session: the request spreads like any other.
    for header in ("", "short", SESSION_ID + "x", "a" * 31 + "/", SESSION_ID.replace("-", ".")):
        assert session_key("/v1/completions", header=header) == "req-1", header


def test_the_standalone_configuration_includes_what_the_live_test_runs():
    main = strip_comments(MAIN.read_text())
    for include in (SESSION_MAP, UPSTREAM, PROXY):
        assert f"include {include.name};" in main, include.name
    upstream = strip_comments(UPSTREAM.read_text())
    assert "hash $txl_session consistent;" in upstream
    assert not [line for line in upstream if line.startswith("keepalive")]  # see upstream.conf
    proxy = strip_comments(PROXY.read_text())
    assert "proxy_pass http://txl_replicas;" in proxy
    (next_upstream,) = [line for line in proxy if line.startswith("proxy_next_upstream ")]
    # Connection errors and timeouts only, and never `non_idempotent`: a POST that reached a replica is not
    # sent to another one by the proxy (its client retries it with its Idempotency-Key).
    assert next_upstream == "proxy_next_upstream error timeout;"
    assert "proxy_buffering off;" in proxy


def test_rendering_the_upstream_keeps_the_shipped_parameters():
    rendered = render_upstream(["127.0.0.1:9001", "127.0.0.1:9002"])
    servers = [line for line in strip_comments(rendered) if line.startswith("server ")]
    assert servers == [
        "server 127.0.0.1:9001 max_fails=1 fail_timeout=10s;",
        "server 127.0.0.1:9002 max_fails=1 fail_timeout=10s;",
    ]
    assert strip_comments(rendered.replace("\n".join(servers), "")) != []


@pytest.mark.parametrize("broken", [None, "proxy_buffering of;", "hash $txl_session consistant;"])
def test_nginx_accepts_the_shipped_configuration(tmp_path, broken):
    """`nginx -t` on deploy/nginx/nginx.conf as shipped (and on broken copies, which it must refuse)."""
    binary = nginx_binary()
    if binary is None:
        pytest.skip("nginx is not installed (.ci/run installs Debian's)")
    conf = tmp_path / "conf"
    conf.mkdir()
    for source in (MAIN, SESSION_MAP, UPSTREAM, PROXY):
        text = source.read_text()
        if broken == "proxy_buffering of;" and source == PROXY:
            text = text.replace("proxy_buffering off;", broken)
        if broken == "hash $txl_session consistant;" and source == UPSTREAM:
            text = text.replace("hash $txl_session consistent;", broken)
        # The shipped access log is under /var/log/nginx; a test machine may not have that directory.
        (conf / source.name).write_text(text.replace("/var/log/nginx/", f"{tmp_path}/"))
    command = [binary, "-t", "-q", "-p", tmp_path, "-c", conf / "nginx.conf", "-e", tmp_path / "error.log"]
    result = subprocess.run(
        [*command, "-g", f"pid {tmp_path}/nginx.pid;"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if broken is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0, broken
