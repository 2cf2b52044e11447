"""Start-up checks of `python -m txl_server`: settings the machine cannot serve stop it in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import txl.linear
from txl_server.__main__ import main
from txl_server.runtime import Runtime, UnsupportedDtype, check_dtype
from txl_server.sessions.redis_server import free_port
from txl_server.settings import Settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_native_bfloat16(monkeypatch):
    """This CPU as an AVX2-only one: no native bfloat16."""
    monkeypatch.setattr(txl.linear, "cpu_runs_bfloat16", lambda: False)


def test_bfloat16_without_native_support_stops_start_up_in_one_line(
    no_native_bfloat16, tiny_model_dir, capsys
):
    assert main(["--model", str(tiny_model_dir), "--dtype", "bfloat16"]) == 2
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
    monkeypatch.setattr(txl.linear, "cpu_runs_bfloat16", lambda: True)
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
