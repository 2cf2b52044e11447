"""The image's health probe finds where the server listens: its --host/--port flags (from /proc), else
TXL_HOST/TXL_PORT, else the defaults; a wildcard address is probed on loopback."""

from __future__ import annotations

import http.server
import threading

from txl_server import healthcheck
from txl_server.healthcheck import local_url, server_address, server_flags


def fake_proc(tmp_path, processes: dict[int, list[str]]):
    tmp_path.mkdir(parents=True, exist_ok=True)
    for pid, argv in processes.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (tmp_path / "self").mkdir()
    return tmp_path


def test_the_flags_come_from_the_server_process(tmp_path):
    proc = fake_proc(
        tmp_path,
        {
            1: ["/sbin/docker-init", "--", "txl-entrypoint", "python", "-m", "txl_server", "--port", "9000"],
            7: ["python", "-m", "txl_server", "--host", "0.0.0.0", "--port=9001"],
            9: ["python", "-m", "txl_server.healthcheck"],
        },
    )
    assert server_flags(proc) == ["--port", "9000"]  # the lowest pid: PID 1 (the init's argv names it too)
    only_check = fake_proc(tmp_path / "other", {3: ["python", "-m", "txl_server", "check", "--port", "1"]})
    assert server_flags(only_check) == []


def test_flags_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("TXL_HOST", "0.0.0.0")
    monkeypatch.setenv("TXL_PORT", "8000")
    assert server_address(["--model", "/models/x", "--port", "9000"]) == ("0.0.0.0", 9000)
    assert server_address(["--host=::", "--port=9001"]) == ("::", 9001)
    assert server_address([]) == ("0.0.0.0", 8000)
    monkeypatch.delenv("TXL_HOST")
    monkeypatch.delenv("TXL_PORT")
    assert server_address([]) == ("127.0.0.1", 8000)


def test_wildcards_are_probed_on_loopback():
    assert local_url("0.0.0.0", 9000, "/health") == "http://127.0.0.1:9000/health"
    assert local_url("::", 9000, "/ready") == "http://[::1]:9000/ready"
    assert local_url("10.0.0.5", 8000) == "http://10.0.0.5:8000"
    assert local_url("txl.internal", 8000, "/health") == "http://txl.internal:8000/health"


def test_the_probe_answers_0_when_the_server_does_and_1_when_not(monkeypatch):
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        monkeypatch.setattr(healthcheck, "server_flags", lambda: ["--host", "0.0.0.0", "--port", str(port)])
        assert healthcheck.main([]) == 0
        assert healthcheck.main(["--path", "/ready"]) == 1
        monkeypatch.setattr(healthcheck, "server_flags", lambda: ["--port", "1"])
        assert healthcheck.main([]) == 1
        own = ["--host", "127.0.0.1", "--port", str(port)]
        assert healthcheck.main(own) == 0  # the probe's own flags win
        server.shutdown()
    assert healthcheck.main(["--host", "127.0.0.1", "--port", str(port)]) == 1
