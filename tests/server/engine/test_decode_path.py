"""The decode path a server serves with (engine.decode_path): the candidates its settings and device allow, the one
start-up chooses, logged whole in one line, shown whole by `GET /v1/system`, and the only thing that decides which
kernels serving runs (the runner passes it down; nothing else is read)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from txl.kernels import DecodePath
from txl.kernels.cpu import paged_decode
from txl.kernels.cpu.paged_decode import cpu_paged_decode
from txl.kernels.triton import common as triton_common
from txl.paged import fused_decode
from txl_server.engine.decode_path import (
    CheckedPath,
    PathSettings,
    candidates,
    graphs_setting,
    linear_kernels,
)

from tests.helpers.live_server import client_fixture, live_server_fixture
from tests.helpers.runtimes import OWNER, generate, running

CPU = torch.device("cpu")
ALL_LINEAR = ("torch", "onednn", "c")
needs_c = pytest.mark.skipif(cpu_paged_decode() is None, reason="no C compiler here")

server = live_server_fixture("decode-path", cuda_graphs=True, max_batch_size=2)
client = client_fixture()


def test_the_graphs_and_linear_kernels_follow_their_settings():
    assert graphs_setting(None, CPU) == ("off", "not a CUDA device (cpu)")
    assert graphs_setting(True, CPU) == ("static", None)
    assert graphs_setting(False, torch.device("cuda")) == ("off", "switched off (TXL_CUDA_GRAPHS=0)")
    assert graphs_setting(None, torch.device("cuda")) == ("cuda", None)
    assert linear_kernels("measured", cpu_kernels=True) == ALL_LINEAR
    assert linear_kernels("measured", cpu_kernels=False) == ("torch", "onednn")
    assert linear_kernels("onednn", cpu_kernels=True) == ("onednn",)
    assert linear_kernels("c", cpu_kernels=False) == ("torch",)


@needs_c
def test_a_cpu_tries_the_c_kernels_then_the_torch_path_as_its_settings_allow():
    offered = candidates(CPU, PathSettings(cuda_graphs=True))
    assert offered.paths == [DecodePath.c(graphs="static"), DecodePath(linear=ALL_LINEAR, graphs="static")]
    assert offered.skipped is None
    forced = candidates(CPU, PathSettings(linear="torch"))
    assert forced.paths == [DecodePath.c(linear=("torch",)), DecodePath()]
    assert forced.paths[0].layers == "torch"  # the fused layer's products are the C loop's
    off = candidates(CPU, PathSettings(cpu_kernels=False))
    assert off.paths == [DecodePath(linear=("torch", "onednn"))] and "TXL_CPU_KERNELS=0" in off.skipped


def test_triton_comes_first_where_it_runs_unless_switched_off(monkeypatch):
    monkeypatch.setattr(triton_common, "available", lambda device: True)  # as on a GPU
    gpu = torch.device("cuda")
    assert candidates(gpu, PathSettings()).paths == [
        DecodePath.triton(graphs="cuda"),
        DecodePath(graphs="cuda"),
    ]
    switched_off = candidates(gpu, PathSettings(triton=False))
    assert (
        switched_off.paths == [DecodePath(graphs="cuda")] and "TXL_TRITON_KERNELS=0" in switched_off.skipped
    )
    assert candidates(CPU, PathSettings()).paths[0] == DecodePath.triton(linear=ALL_LINEAR)


def test_the_log_line_names_every_part_and_why_not_faster():
    checked = CheckedPath(DecodePath(), attention_reason="the c kernels vs the torch path raised X")
    assert checked.line() == (
        "decode path: attention torch, prefill torch, layers torch, linear torch, embedding torch, "
        "softmax torch, sampler torch, graphs off (kernels: the c kernels vs the torch path raised X)"
    )


def test_system_shows_the_served_decode_path_whole(client, server):
    serving = client.get("/v1/system").json()["serving"]
    path = server.app.state.runtime.worker.runner.path
    assert serving["decode_path"] == {**dataclasses.asdict(path), "linear": list(path.linear)}
    assert serving["decode_path"]["graphs"] == "static" and serving["attention"] == path.attention
    if cpu_paged_decode() is not None:
        assert path == DecodePath.c(graphs="static")


async def test_start_up_logs_the_path_once_and_serving_runs_its_kernels_alone(
    make_settings, monkeypatch, caplog
):
    """With the C kernels switched off by the settings (TXL_CPU_KERNELS=0) serving never calls them, though
    they build here; with the defaults it does (the fused layer, for these few rows): which kernels run is the
    path's, nothing else's."""
    calls: list[str] = []
    call, fused = paged_decode.PagedDecodeKernel.__call__, fused_decode.forward

    def attention(self, *args):
        calls.append("attention")
        return call(self, *args)

    def layers(*args):
        calls.append("layers")
        return fused(*args)

    monkeypatch.setattr(paged_decode.PagedDecodeKernel, "__call__", attention)
    monkeypatch.setattr(fused_decode, "forward", layers)
    with caplog.at_level(logging.INFO, logger="txl_server.engine.selfcheck"):
        async with running(make_settings(cpu_kernels=False, linear_kernel="torch")) as rt:
            path = rt.worker.runner.path
            meta = await rt.service.create(OWNER, text="The sea was")
            tokens, _ = await generate(rt.service, meta.id, max_tokens=4)
    assert path == DecodePath() and len(tokens) == 4 and calls == []
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decode path:")]
    assert lines == [
        f"decode path: {path.describe()} (kernels: the C kernels are switched off (TXL_CPU_KERNELS=0); "
        "graphs: not a CUDA device (cpu))"
    ]
    if cpu_paged_decode() is not None:
        async with running(make_settings()) as rt:
            assert rt.worker.runner.path == DecodePath.c()
            meta = await rt.service.create(OWNER, text="The sea was")
            await generate(rt.service, meta.id, max_tokens=4)
        assert "layers" in calls
