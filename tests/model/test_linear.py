"""The CPU linear layer's kernels: each computes what torch's does, and each runs where it can.

oneDNN runs bfloat16 only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT. These tests take the other
branch on any machine: by replacing the probe (and oneDNN's kernel with one that refuses bfloat16, as it does on
an AVX2-only CPU), and by running a process with oneDNN itself limited to AVX2. How a kernel is chosen is in
test_kernel_choice.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import txl
from txl.kernels import DecodePath
from txl.kernels.cpu import linear
from txl.kernels.cpu.linear_choice import KERNELS

from tests.helpers.tiny_models import tiny_model

REPO = Path(__file__).resolve().parents[2]
AVX2_ERROR = "mkldnn_linear_pointwise: bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
needs_onednn = pytest.mark.skipif(not linear.onednn_available(), reason="this torch has no oneDNN")
MEASURED = DecodePath(linear=KERNELS)  # each layer shape: the kernel measured fastest


def _log_probs(
    model: txl.TransfoXLLMHeadModel, tokens: torch.Tensor, path: DecodePath = MEASURED
) -> torch.Tensor:
    with torch.inference_mode():
        hidden, memory = model(tokens[:, :12], model.empty_memory(tokens.size(0)), path=path)
        first = model.log_probs(hidden, path)
        hidden, _ = model(tokens[:, 12:], memory, path=path)  # over a memory too
        return torch.cat([first, model.log_probs(hidden, path)], dim=1)


@needs_onednn
def test_the_bfloat16_probe_agrees_with_onednn():
    weight = torch.randn(8, 16).to(torch.bfloat16)
    rows = torch.randn(3, 16).to(torch.bfloat16)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        linear._onednn(rows, packed, None)
        runs = True
    except RuntimeError as exc:
        assert "bf16" in str(exc), exc
        runs = False
    assert linear.cpu_runs_bfloat16() is runs


@needs_onednn
def test_bfloat16_on_a_cpu_without_it_takes_torchs_kernel_with_the_same_result(monkeypatch):
    tokens = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(4))
    reference = _log_probs(tiny_model(seed=2), tokens)
    native = _log_probs(tiny_model(seed=2).to(torch.bfloat16), tokens)  # oneDNN where this CPU allows

    onednn_dtypes: list[torch.dtype] = []
    onednn = linear._onednn

    def avx2_onednn(
        rows, packed, bias, activation="none"
    ):  # oneDNN on AVX2 alone: float32 runs, bfloat16 raises
        onednn_dtypes.append(rows.dtype)
        if rows.dtype == torch.bfloat16:
            raise RuntimeError(AVX2_ERROR)
        return onednn(rows, packed, bias, activation)

    monkeypatch.setattr(linear, "_onednn", avx2_onednn)
    monkeypatch.setattr(linear, "cpu_runs_bfloat16", lambda: False)
    onednn_path = DecodePath(linear=("onednn",))  # wherever it can run
    plain = _log_probs(tiny_model(seed=2).to(torch.bfloat16), tokens, onednn_path)
    assert onednn_dtypes == []
    assert (plain.exp() - native.exp()).abs().max() < 0.02  # both bfloat16, summed in a different order
    assert (plain.exp() - reference.exp()).abs().max() < 0.05

    _log_probs(tiny_model(seed=2), tokens, onednn_path)  # float32 keeps oneDNN
    assert onednn_dtypes and set(onednn_dtypes) == {torch.float32}


def _available(kernel: str) -> bool:
    return kernel in linear.candidates(torch.float32, 1)


@pytest.mark.parametrize("kernel", ["onednn", "c"])
@pytest.mark.parametrize("rows", [1, 3, 16, 80, 300])
def test_each_kernel_computes_what_torchs_kernel_does(kernel, rows):
    if not _available(kernel):
        pytest.skip(f"no {kernel} kernel here")
    generator = torch.Generator().manual_seed(rows)
    layer = torch.nn.Linear(96, 200)
    x = torch.randn(rows, 96, generator=generator)
    transposed = torch.randn(96, 200, generator=generator).t()  # as the adaptive softmax's projections are
    only = (kernel,)
    with torch.inference_mode():
        plain = linear.linear(x, layer, ("torch",))
        plain_t = linear.packed_linear(x, transposed, None, layer, "_t", kernels=("torch",))
        out = linear.linear(x, layer, only)
        no_bias = linear.packed_linear(x, layer.weight, None, layer, "_other", kernels=only)
        out_t = linear.packed_linear(x, transposed, None, layer, "_t", kernels=only)
        batched = linear.linear(x.view(1, rows, 96), layer, only)  # any leading shape
        rectified = linear.linear(x, layer, only, relu=True)  # oneDNN: a post-op of its product
    scale = plain.abs().max()
    assert (out - plain).abs().max() <= 1e-5 * scale
    assert torch.equal(rectified, out.clamp_min(0)) and (rectified == 0).any()
    assert (no_bias - (plain - layer.bias)).abs().max() <= 1e-5 * scale
    assert (out_t - plain_t).abs().max() <= 1e-5 * plain_t.abs().max()
    assert batched.shape == (1, rows, 200) and torch.equal(batched[0], out)


@pytest.mark.parametrize("kernel", ["onednn", "c"])
def test_each_kernel_computes_what_torchs_kernel_does_in_bfloat16(kernel):
    if kernel == "onednn" and not linear.cpu_runs_bfloat16():
        pytest.skip("no native bfloat16 here")
    if not _available(kernel):
        pytest.skip(f"no {kernel} kernel here")
    layer = torch.nn.Linear(96, 200).to(torch.bfloat16)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    exact = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
    with torch.inference_mode():
        out = linear.linear(x, layer, (kernel,))
    assert out.dtype == torch.bfloat16
    # float32 sums rounded once to bfloat16: within half a bfloat16 step of the exact result
    assert ((out.float() - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all()


def test_a_model_gives_the_same_log_probabilities_whichever_kernels_run():
    """Decoding and prompt segments at several batch sizes, with every layer on one kernel or on the measured
    choices (which may mix them by rows): 1e-5 in float32."""
    model = tiny_model(seed=3)
    tokens = torch.randint(0, 64, (6, 20), generator=torch.Generator().manual_seed(5))

    def run(kernels: tuple[str, ...]) -> torch.Tensor:
        path = DecodePath(linear=kernels)
        with torch.inference_mode():
            hidden, memory = model(tokens[:, :16], model.empty_memory(6), path=path)
            steps = [model.log_probs(hidden, path)]
            for t in range(16, 20):  # decoding, 6 rows
                hidden, memory = model(tokens[:, t : t + 1], memory, path=path)
                steps.append(model.log_probs(hidden, path))
            hidden, _ = model(tokens[:1, 15:16], model.empty_memory(1), path=path)  # one row, one token
            steps.append(model.log_probs(hidden, path).expand(6, -1, -1))
            return torch.cat(steps, dim=1)

    plain = run(("torch",))
    for kernel in ("onednn", "c"):
        if _available(kernel):
            assert (run((kernel,)) - plain).abs().max() < 1e-5, kernel
    assert (run(KERNELS) - plain).abs().max() < 1e-5  # the measured choices


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="linear"):
        DecodePath(linear=("fastest",))
    with pytest.raises(ValueError, match="linear"):
        DecodePath(linear=())


@needs_onednn
def test_a_process_limited_to_avx2_runs_a_bfloat16_model():
    """oneDNN's own switch makes this CPU an AVX2-only one: the probe says so and the model runs."""
    script = (
        "import torch, txl\nfrom txl.kernels.cpu import linear\n"
        "from tests.helpers.tiny_models import tiny_model\n"
        "model, path = tiny_model(seed=2).to(torch.bfloat16), txl.fastest('cpu')\n"
        "with torch.inference_mode():\n"
        "    hidden, _ = model(torch.arange(16).view(1, 16), model.empty_memory(), path=path)\n"
        "    assert torch.isfinite(model.log_probs(hidden, path)).all()\n"
        "print('bfloat16 native:', linear.cpu_runs_bfloat16())\n"
        "print('vector units:', linear.kernel_choices().machine.vector.split()[0])\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == ["bfloat16 native: False", "vector units: AVX2"]
