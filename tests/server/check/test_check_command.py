"""`python -m txl_server check` on the CPU (what CI runs): its report, its exit status, a broken engine found
out, and the GPU section of docs/benchmarks.md written from a report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from txl.paged import step as paged_step
from txl_server.check import command, gpu_section
from txl_server.check.parity import Parity
from txl_server.check.report import CheckReport
from txl_server.check.speed import Speed
from txl_server.engine.device_report import DeviceReport, PathReport, PoolReport, WindowReport
from txl_server.memory_budgets import MemoryBudgets

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(240)
def test_the_check_passes_on_the_cpu_and_prints_its_report(tiny_model_dir):
    """The CPU subset, with the graphs' static buffers on (TXL_CUDA_GRAPHS=1) so that they are checked too."""
    done = subprocess.run(
        [sys.executable, "-m", "txl_server", "check", "--model", str(tiny_model_dir), "--tokens", "120"],
        cwd=REPO,
        env={**os.environ, "TXL_CUDA_GRAPHS": "1", "TXL_MAX_BATCH_SIZE": "4"},
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("checking tiny-byte from") and lines[-1] == "every check passed"

    def line(name: str) -> str:
        found = [x for x in lines if x[5:].startswith(name)]
        assert len(found) == 1, (name, done.stdout)
        return found[0]

    assert line("device").split(None, 1)[1].startswith("cpu (") and "float32" in line("device")
    assert line("kernel vs torch").startswith("ok ")
    assert line("graphs vs eager").startswith("ok ") and "18 graphs replayed against eager" in line(
        "graphs vs eager"
    )
    parity = line("parity")
    assert (
        parity.startswith("ok ")
        and "119 positions (40 prompt, 80 generated), window grid 8, mem_len 32" in parity
    )
    assert line("greedy tokens").startswith("ok ") and line("seeded generation").startswith("ok ")
    assert "blocks of 16 positions" in line("memory pool") and "sessions at mem_len 32" in line("budgets")
    assert "GB/s" in line("copy bandwidth") and "x the floor" in line("decode, 1 session")
    # decoding measured at the served mem_len, against a floor that counts the memory's keys and values
    assert "at mem 32;" in line("decode, 1 session") and "MiB of keys, values" in line("decode, 1 session")
    assert "at mem 32;" in line("decode, 4 sessions") and "each session's keys" in line("decode, 4 sessions")
    assert "tokens/s over" in line("scoring")
    assert "Traceback" not in done.stderr


def test_a_broken_engine_makes_the_check_fail(tiny_model_dir, monkeypatch, capsys):
    """Keys written into the pool slightly wrong (a kernel bug the reference path, which keeps no pool, does not
    share): the start-up checks compare paths that share it and pass; parity finds it, and the check exits 1."""
    write = paged_step._write

    def skewed(pool, blocks, slots, layer, keys, values, layer_input):
        write(pool, blocks, slots, layer, keys * 1.05, values, layer_input)

    monkeypatch.setattr(paged_step, "_write", skewed)
    assert command.main(["--model", str(tiny_model_dir), "--tokens", "60"]) == 1
    out = capsys.readouterr().out
    assert "FAIL parity" in out and "check(s) failed" in out


def test_the_gpu_section_is_written_only_from_a_gpu(tiny_model_dir, capsys):
    assert command.main(["--model", str(tiny_model_dir), "--write-benchmarks"]) == 2
    assert "--device cuda" in capsys.readouterr().err


def test_the_gpu_section_holds_the_checks_and_the_speed_against_the_floor(tmp_path):
    """A report as an H100 would give it, through the benchmarks' section mechanism into a scratch docs dir."""
    device = DeviceReport(
        device="cuda:0",
        device_name="NVIDIA H100 80GB HBM3",
        dtype="bfloat16",
        decode_path=PathReport("triton", "torch", "triton", ["torch"], "triton", "triton", "triton", "cuda"),
        attention="triton",
        attention_reason=None,
        cuda_graphs="on",
        cuda_graphs_reason=None,
        graphs=42,
        pool=PoolReport(131072, 16, 2 * 2**30, True),
        budgets=MemoryBudgets(2 * 2**30, 2**29, 4 * 2**30, "device: 2 GiB on a GPU"),
        window=WindowReport(128, 512, 512, 639, False),
        device_ok=True,
    )
    report = CheckReport(device)
    report.add("parity", "299 positions: max |delta log p| 0.04 against the reference in bfloat16", True)
    report.add("graphs vs eager", "42 graphs replayed against eager", True)
    report.parity = Parity("bfloat16", 128, 512, 100, 200, 0.04, True, 0.1, 0.01, 0.1, 0.01, True, 0)
    report.speed = Speed(3e12, 27 * 2**20, 9.4e-6, 1e-4, 64, 2e-4, 8192, 1e6, 1e8, 512, 4e-5)
    path = gpu_section.write_section(report, tmp_path)
    text = path.read_text()
    assert path == tmp_path / "benchmarks.md" and (tmp_path / "benchmarks" / "gpu.md").exists()
    assert "## GPU: `python -m txl_server check` on NVIDIA H100 80GB HBM3" in text
    parity = "| parity | 299 positions: max \\|delta log p\\| 0.04 against the reference in bfloat16 | yes |"
    assert parity in text
    assert "| decode, 1 session | 10,000 | 0.1 | 0.0094 | 10.6 |" in text
    assert "| decode, 64 sessions | 320,000 | 0.2 | 0.04 | 5 |" in text
    assert "CUDA graphs on, memories of 512)" in text
    assert "Decode path: attention triton, prompt attention torch, layers triton, linear torch," in text
