"""A CUDA device that is not there stops the server at once with one line: what is missing and what to do (no GPU
given to the container, an NVIDIA driver too old for torch's CUDA build, no driver, a CPU build of torch), exit
status 2, before the model is loaded. Each case is simulated on the CPU: the facts torch and /proc would give."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time

import pytest
from txl_server import __main__ as server_main
from txl_server import device_check
from txl_server.device_check import CudaFacts, driver_version, explain, gather

from tests.helpers.tiny_models import make_byte_model_dir

CUDA_BUILD = CudaFacts(
    torch_version="2.13.0+cu130",
    cuda_build="13.0",
    available=False,
    device_count=0,
    driver=None,
    device_nodes=0,
    in_container=True,
    in_image=True,
    torch_reason="",
)
CONTAINER_WITHOUT_GPUS = dataclasses.replace(CUDA_BUILD, driver="580.95.05")
OLD_DRIVER = dataclasses.replace(
    CUDA_BUILD,
    driver="535.104.05",
    device_nodes=1,
    torch_reason="CUDA initialization: The NVIDIA driver on your system is too old (found version 12020).",
)
NO_DRIVER_OUTSIDE_DOCKER = dataclasses.replace(CUDA_BUILD, in_container=False, in_image=False)
CPU_TORCH = dataclasses.replace(CUDA_BUILD, torch_version="2.13.0+cpu", cuda_build=None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_line(message: str | None) -> str:
    assert message is not None and "\n" not in message, message
    assert "cannot load the model" not in message
    return message


def test_a_container_without_gpus_says_gpus_all_and_the_toolkit():
    for facts in (CONTAINER_WITHOUT_GPUS, CUDA_BUILD):  # the host's driver seen in /proc, or not
        message = one_line(explain("cuda", "bfloat16", facts))
        assert "this container has no GPU" in message
        assert "--gpus all" in message and "NVIDIA Container Toolkit" in message
        assert "-e TXL_DEVICE=cpu -e TXL_DTYPE=float32" in message


def test_an_old_driver_names_the_version_needed():
    message = one_line(explain("cuda", "bfloat16", OLD_DRIVER))
    assert "NVIDIA driver 535.104.05 is too old for this torch's CUDA 13.0 build" in message
    assert "needs driver >= 580.65.6" in message
    assert "--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126" in message  # the image's remedy
    outside = one_line(explain("cuda", "float32", dataclasses.replace(OLD_DRIVER, in_image=False)))
    assert "install torch from https://download.pytorch.org/whl/cu126" in outside
    assert "--device cpu (TXL_DEVICE=cpu)" in outside
    new_enough = dataclasses.replace(OLD_DRIVER, driver="580.95.05", torch_reason="something else")
    assert "too old" not in one_line(explain("cuda", "bfloat16", new_enough))


def test_no_driver_outside_docker_says_install_one_or_use_the_cpu():
    message = one_line(explain("cuda:0", "bfloat16", NO_DRIVER_OUTSIDE_DOCKER))
    assert "TXL_DEVICE=cuda:0, but this machine has no NVIDIA driver" in message
    assert "install its driver >= 580" in message
    assert "--device cpu --dtype float32 (TXL_DEVICE=cpu)" in message
    assert "--gpus" not in message


def test_a_cpu_build_of_torch_says_so():
    in_image = one_line(explain("cuda", "float32", CPU_TORCH))
    assert "this is the CPU image (torch 2.13.0+cpu)" in in_image and "leave TXL_DEVICE unset" in in_image
    outside = dataclasses.replace(CPU_TORCH, in_container=False, in_image=False)
    assert "is a CPU build: install torch's CUDA build" in one_line(explain("cuda", "float32", outside))


def test_a_gpu_index_beyond_those_visible():
    two = dataclasses.replace(CUDA_BUILD, available=True, device_count=2, device_nodes=2)
    assert explain("cuda:1", "bfloat16", two) is None
    assert explain("cuda", "bfloat16", two) is None
    message = one_line(explain("cuda:2", "bfloat16", two))
    assert "2 GPU(s) are visible (cuda:0 to cuda:1)" in message and "--gpus" in message


def test_other_causes_repeat_what_torch_said():
    odd = dataclasses.replace(CONTAINER_WITHOUT_GPUS, device_nodes=1, torch_reason="CUDA unknown error")
    message = one_line(explain("cuda", "bfloat16", odd))
    assert "NVIDIA driver 580.95.05" in message and "CUDA unknown error" in message


def test_a_cpu_device_is_not_checked():
    assert explain("cpu", "float32", CPU_TORCH) is None
    device_check.check_device("cpu", "float32")


def test_the_driver_version_and_the_devices_are_read_from_proc_and_dev(tmp_path):
    version = tmp_path / "version"
    version.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    assert driver_version(version) == "535.104.05"
    version.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n")
    assert driver_version(version) == "580.95.05"
    assert driver_version(tmp_path / "absent") is None
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    root = tmp_path / "root"
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    (root / ".dockerenv").touch()
    facts = gather(dev=dev, root=root)
    assert facts.device_nodes == 2 and facts.in_container and not facts.in_image
    assert facts.cuda_build is None and not facts.available  # this machine's torch: the CPU build
    (root / device_check.IMAGE_ENTRYPOINT).touch()
    assert gather(dev=dev, root=root).in_image


@pytest.mark.parametrize("facts", [CONTAINER_WITHOUT_GPUS, OLD_DRIVER, NO_DRIVER_OUTSIDE_DOCKER])
def test_the_server_prints_the_line_and_exits_2_before_loading(facts, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(device_check, "gather", lambda: facts)
    loaded = []
    monkeypatch.setattr("txl_server.runtime.load_model", lambda settings: loaded.append(settings))
    model = make_byte_model_dir(tmp_path / "model")
    code = server_main.main(
        ["--device", "cuda", "--port", str(free_port()), "--model", str(model), "--ephemeral"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and not loaded
    assert err == explain("cuda", "float32", facts), err


def test_python_m_txl_server_on_a_machine_without_cuda_exits_at_once(tmp_path):
    """For real, on this machine's CPU build of torch: one line, exit 2, in the time torch takes to import."""
    model = make_byte_model_dir(tmp_path / "model")
    started = time.monotonic()
    argv = ["--device", "cuda", "--port", str(free_port()), "--model", str(model), "--ephemeral"]
    done = subprocess.run(
        [sys.executable, "-m", "txl_server", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("TXL_DEVICE=cuda, but"), done.stderr
    assert "is a CPU build" in lines[0]
    assert time.monotonic() - started < 60
