"""The CPU linear layer's kernel: oneDNN's packed one where it can run, torch's plain one elsewhere.

oneDNN runs bfloat16 only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT. These tests take the other
branch on any machine: by replacing the probe (and oneDNN's kernel with one that refuses bfloat16, as it does on
an AVX2-only CPU), and by running a process with oneDNN itself limited to AVX2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import txl.linear

from .helpers import tiny_model

REPO = Path(__file__).resolve().parents[2]
AVX2_ERROR = (
    "mkldnn_linear: bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
)


def _log_probs(model: txl.TransfoXLLMHeadModel, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        hidden, memory = model(tokens[:, :12], model.empty_memory(tokens.size(0)))
        first = model.log_probs(hidden)
        hidden, _ = model(tokens[:, 12:], memory)  # over a memory too
        return torch.cat([first, model.log_probs(hidden)], dim=1)


def test_the_bfloat16_probe_agrees_with_onednn():
    weight = torch.randn(8, 16).to(torch.bfloat16)
    rows = torch.randn(3, 16).to(torch.bfloat16)
    try:
        torch._C._nn.mkldnn_linear(rows.to_mkldnn(), weight.to_mkldnn(), None)
        runs = True
    except RuntimeError as exc:
        assert "bf16" in str(exc), exc
        runs = False
    assert txl.linear.cpu_runs_bfloat16() is runs


def test_bfloat16_on_a_cpu_without_it_takes_the_plain_kernel_with_the_same_result(monkeypatch):
    tokens = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(4))
    reference = _log_probs(tiny_model(seed=2), tokens)
    native = _log_probs(tiny_model(seed=2).to(torch.bfloat16), tokens)  # packed where this CPU allows

    packed_dtypes: list[torch.dtype] = []
    onednn_linear = torch._C._nn.mkldnn_linear

    def avx2_onednn(rows, weight, bias):  # oneDNN on an AVX2-only CPU: float32 runs, bfloat16 raises
        packed_dtypes.append(rows.dtype)
        if rows.dtype == torch.bfloat16:
            raise RuntimeError(AVX2_ERROR)
        return onednn_linear(rows, weight, bias)

    monkeypatch.setattr(torch._C._nn, "mkldnn_linear", avx2_onednn)
    monkeypatch.setattr(txl.linear, "cpu_runs_bfloat16", lambda: False)
    plain = _log_probs(tiny_model(seed=2).to(torch.bfloat16), tokens)
    assert torch.bfloat16 not in packed_dtypes
    assert (plain.exp() - native.exp()).abs().max() < 0.02  # both bfloat16, summed in a different order
    assert (plain.exp() - reference.exp()).abs().max() < 0.05

    _log_probs(tiny_model(seed=2), tokens)  # float32 keeps the packed kernel
    assert packed_dtypes and set(packed_dtypes) == {torch.float32}


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not in this torch build")
def test_a_process_limited_to_avx2_runs_a_bfloat16_model():
    """oneDNN's own switch makes this CPU an AVX2-only one: the probe says so and the model runs."""
    script = (
        "import torch, txl.linear\n"
        "from tests.model.helpers import tiny_model\n"
        "model = tiny_model(seed=2).to(torch.bfloat16)\n"
        "with torch.inference_mode():\n"
        "    hidden, _ = model(torch.arange(16).view(1, 16), model.empty_memory())\n"
        "    assert torch.isfinite(model.log_probs(hidden)).all()\n"
        "print('bfloat16 native:', txl.linear.cpu_runs_bfloat16())\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "bfloat16 native: False"
