"""Start-up of `python -m txl_server`: settings the machine cannot serve stop it in one line; a server that
starts says what it is doing and, once it answers, where its playground and API docs are."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from txl.kernels.cpu import linear
from txl_server.__main__ import main, ready_message
from txl_server.runtime import Runtime, UnsupportedDtype, check_dtype
from txl_server.sessions.redis_server import free_port
from txl_server.settings import Settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_native_bfloat16(monkeypatch):
    """This CPU as an AVX2-only one: no native bfloat16."""
    monkeypatch.setattr(linear, "cpu_runs_bfloat16", lambda: False)


def test_bfloat16_without_native_support_stops_start_up_in_one_line(
    no_native_bfloat16, tiny_model_dir, capsys
):
    argv = ["--model", str(tiny_model_dir), "--dtype", "bfloat16", "--port", str(free_port())]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--dtype float32" in lines[0] and "bfloat16" in lines[0], lines


async def test_the_runtime_refuses_it_too(no_native_bfloat16, make_settings):
    """The check sits in model loading, so an app made with `create_app(settings)` refuses it as well."""
    with pytest.raises(UnsupportedDtype, match="--dtype float32"):
        await Runtime(make_settings(dtype="bfloat16")).start()


def test_other_dtypes_and_devices_pass(no_native_bfloat16, tiny_model_dir, monkeypatch):
    for dtype in ("float32", "float16"):
        check_dtype(Settings(model=tiny_model_dir, dtype=dtype))
    check_dtype(Settings(model=tiny_model_dir, dtype="bfloat16", device="cuda"))  # GPUs compute bfloat16
    monkeypatch.setattr(linear, "cpu_runs_bfloat16", lambda: True)
    check_dtype(Settings(model=tiny_model_dir, dtype="bfloat16"))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not in this torch build")
def test_a_server_limited_to_avx2_refuses_bfloat16(tiny_model_dir, tmp_path):
    """oneDNN's own switch makes this CPU an AVX2-only one for a real server process."""
    env = {
        **os.environ,
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "TXL_REDIS_DATA_DIR": str(tmp_path),
    }
    argv = ["--model", str(tiny_model_dir), "--dtype", "bfloat16", "--port", str(free_port())]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "txl_server", *argv],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the server started instead of refusing: {exc.stderr!r}")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--dtype float32" in lines[0], done.stderr


@pytest.mark.parametrize(
    ("host", "shown"),
    [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "127.0.0.1"), ("::", "[::1]"), ("::1", "[::1]"), ("box", "box")],
)
def test_the_ready_line_names_reachable_addresses(host, shown):
    assert ready_message(host, 9000) == (
        f"ready: the playground is at http://{shown}:9000/ and the API docs at http://{shown}:9000/docs"
    )


@pytest.mark.timeout(120)  # a server that never logs would block the read
def test_the_log_says_what_start_up_does_and_ends_with_where_to_go(tiny_model_dir, redis_server):
    env = {**os.environ, "TXL_REDIS_URL": redis_server.url, "TXL_LOG_LEVEL": "info"}
    argv = ["--model", str(tiny_model_dir), "--port", str(free_port())]
    process = subprocess.Popen(
        [sys.executable, "-m", "txl_server", *argv],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:  # uvicorn's and ours, in the order a person reads them
            lines.append(line.rstrip("\n"))
            if "ready:" in line or len(lines) > 50:
                break
        ready = re.search(r"playground is at (\S+) and the API docs at (\S+)$", lines[-1])
        assert ready is not None, "\n".join(lines)
        playground, docs = ready.groups()
        assert "<html" in httpx.get(playground, timeout=10).text
        assert "swagger" in httpx.get(docs, timeout=10).text.lower()
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert any(f"loading the model in {tiny_model_dir}" in line for line in lines), lines
    assert any("Uvicorn running on" in line for line in lines[:-1]), lines  # listening before it says so
