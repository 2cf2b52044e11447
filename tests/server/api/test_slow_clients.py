"""Slow and idle clients hold nothing, against a real server process (`python -m txl_server`: uvicorn with the
head deadline of serving.py, the body deadline and the slots of api/middleware.py): connections that never send
a request, heads sent a byte at a time, bodies that trickle or never end are cut off by their deadlines, and
meanwhile a real client, with every slot of the server's one, is served."""

from __future__ import annotations

import socket
import time

import pytest

from tests.helpers.server_process import ServerProcess, process_env

HEAD_SECONDS = 1.0
BODY_SECONDS = 1.0


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server, tmp_path_factory):
    env = process_env(tiny_model_dir, redis_server.url, "slow-clients")
    logs = tmp_path_factory.mktemp("slow-clients")
    with ServerProcess(
        logs / "server.log",
        **env,
        TXL_HEADER_TIMEOUT_SECONDS=str(HEAD_SECONDS),
        TXL_BODY_TIMEOUT_SECONDS=str(BODY_SECONDS),
        TXL_MAX_CONCURRENT_REQUESTS="2",
    ) as process:
        yield process


def connect(server: ServerProcess, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    if first:
        sock.sendall(first)
    return sock


def closed_by_server(sock: socket.socket, within: float) -> tuple[bool, bytes]:
    """Whether the server closed `sock` within `within` seconds, and what it sent before."""
    sock.settimeout(within)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return False, received
    except ConnectionResetError:
        pass
    return True, received


POST_HEAD = (
    b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n"
)
CHUNKED_HEAD = (
    b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def test_slow_and_idle_clients_are_cut_off_and_take_no_slot(server):
    idle = [connect(server) for _ in range(50)]  # never send a request
    heads = [connect(server, b"GET /v1/mod") for _ in range(10)]  # a head that never ends
    bodies = [connect(server, POST_HEAD + b'{"text"') for _ in range(10)]  # a body that never comes whole
    chunked = [connect(server, CHUNKED_HEAD + b"5\r\nhello\r\n") for _ in range(10)]  # chunks without an end
    started = time.monotonic()
    with server.client() as client:
        while time.monotonic() - started < 0.8:  # meanwhile a real client is served, at every try
            time.sleep(0.05)
            for trickle in heads:
                trickle.sendall(b"e")  # bytes keep coming: the head's deadline is not moved by them
            assert client.get("/v1/sessions").status_code == 200
            assert client.post("/v1/sessions", json={"text": "served"}).status_code == 201
    for sock in idle + heads:
        closed, received = closed_by_server(sock, HEAD_SECONDS + 2.0)
        assert closed and received == b"", received
    for sock in bodies + chunked:
        closed, received = closed_by_server(sock, BODY_SECONDS + 2.0)
        assert closed and received.startswith(b"HTTP/1.1 408"), received[:200]
        assert b'"type":"request_timeout"' in received and b"connection: close" in received.lower()
    assert time.monotonic() - started < max(HEAD_SECONDS, BODY_SECONDS) + 2.5


def test_a_connection_waiting_for_its_next_request_gets_the_same_deadline(server):
    sock = connect(server, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(5)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    for _ in range(4):  # the next head, a byte every 0.4 s: never whole by the deadline
        time.sleep(0.4)
        try:
            sock.sendall(b"G")
        except OSError:
            break
    closed, _ = closed_by_server(sock, 2.0)
    assert closed
