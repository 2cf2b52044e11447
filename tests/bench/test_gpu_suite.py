"""`bench gpu` writes its section out after each part (review round 3, finding 5: a GPU window is short, and a
run that fails or runs out of time must keep what it measured): the kernels' table lands on disk before the next
part starts, and a part that fails leaves it there."""

from __future__ import annotations

import pytest
import torch

from bench import gpu, gpu_micro


def test_a_part_that_fails_leaves_the_parts_before_it_written(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "copy_bandwidth", lambda device, mib: 1e11)
    case = gpu_micro.Case("a kernel", 1, lambda: None, 10**6)
    monkeypatch.setattr(gpu_micro, "linear_cases", lambda device, dtype: [case])
    monkeypatch.setattr(gpu_micro, "attention_cases", lambda device, dtype: [])
    monkeypatch.setattr(gpu_micro, "cuda_graph_timer", lambda call: 2e-5)

    def broken(*args, **kwargs):
        raise RuntimeError("the second part failed")

    monkeypatch.setattr(gpu, "wt103_model", broken)
    with pytest.raises(RuntimeError, match="the second part failed"):
        gpu.measure(torch.device("cpu"), gpu.Sizes(), http=False, keep=lambda section: section.save(tmp_path))
    written = (tmp_path / "benchmarks" / "gpu.md").read_text()
    assert "The fused body's kernels alone" in written
    assert "| a kernel | 1 | 20.0 | 10.0 | 2 |" in written
