"""Whether the settings' device can be used, checked before the model is loaded: a CUDA device that is not there
stops the server at once with one line naming what is missing and what to do, instead of a failure to load the
model (torch's "Found no NVIDIA driver on your system" surfaced as "cannot load the model").

Four causes, told apart by what the process can see:
- torch is a CPU build (the CPU image, or a CPU wheel outside Docker);
- a container started without `--gpus`: the host's driver shows in /proc/driver/nvidia, but no /dev/nvidiaN;
- an NVIDIA driver older than the CUDA release torch was built for needs (CUDA's minor-version compatibility: a
  driver of the major release's first version runs every minor release of it);
- no NVIDIA driver at all on this machine.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

# The oldest Linux driver that runs each CUDA major release (NVIDIA's CUDA compatibility guide, minor-version
# compatibility): torch built for CUDA 13.0 needs 580, for any 12.x 525.
MINIMUM_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}
# A CUDA build of torch for drivers older than the image's (PyTorch's index for CUDA 12.6).
OLDER_CUDA_INDEX = "https://download.pytorch.org/whl/cu126"
IMAGE_ENTRYPOINT = "usr/local/bin/txl-entrypoint"  # the Dockerfile installs it


class DeviceUnavailable(RuntimeError):
    """The settings' device cannot be used; the message is one line: what is missing and what to do."""


@dataclass(frozen=True)
class CudaFacts:
    torch_version: str
    cuda_build: str | None  # torch.version.cuda: None for a CPU build
    available: bool  # torch.cuda.is_available()
    device_count: int
    driver: str | None  # the loaded NVIDIA kernel module's version, e.g. "535.104.05"; None: no driver seen
    device_nodes: int  # /dev/nvidia0, /dev/nvidia1, ...: the GPUs given to this process's container
    in_container: bool  # any container (Docker's /.dockerenv, Podman's /run/.containerenv)
    in_image: bool  # this project's image (its entry point is there): the advice names its build args
    torch_reason: str  # what torch warned when it found no usable GPU


def driver_version(path: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    """The NVIDIA kernel module's version (visible in containers too, with or without --gpus)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else None


def gather(dev: Path = Path("/dev"), root: Path = Path("/")) -> CudaFacts:
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    return CudaFacts(
        torch_version=torch.__version__,
        cuda_build=torch.version.cuda,
        available=available,
        device_count=torch.cuda.device_count() if available else 0,
        driver=driver_version(),
        device_nodes=len([p for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)]),
        in_container=(root / ".dockerenv").exists() or (root / "run" / ".containerenv").exists(),
        in_image=(root / IMAGE_ENTRYPOINT).exists(),
        torch_reason="; ".join(
            str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()
        ),
    )


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def explain(device: str, dtype: str, facts: CudaFacts) -> str | None:
    """The one line that says why `device` cannot be used, or None when it can."""
    kind, _, index_text = device.partition(":")
    if kind != "cuda":
        return None
    if facts.in_image:
        on_cpu = (
            "or serve on the CPU with -e TXL_DEVICE=cpu -e TXL_DTYPE=float32 (or the CPU image, VARIANT=cpu)"
        )
    else:
        on_cpu = "or serve on the CPU with --device cpu" + (" --dtype float32" if dtype != "float32" else "")
        on_cpu += " (TXL_DEVICE=cpu)"
    said = f"TXL_DEVICE={device}"
    if facts.cuda_build is None and facts.in_image:
        return (
            f"{said}, but this is the CPU image (torch {facts.torch_version}): for a GPU, build the CUDA image "
            "(without --build-arg VARIANT=cpu); to serve on the CPU, leave TXL_DEVICE unset"
        )
    if facts.cuda_build is None:
        return (
            f"{said}, but this torch ({facts.torch_version}) is a CPU build: install torch's CUDA build (PyPI's "
            f"Linux x86_64 wheel); {on_cpu}"
        )
    if facts.available:
        index = int(index_text) if index_text.isdigit() else 0
        if index < facts.device_count:
            return None
        visible = f"cuda:0 to cuda:{facts.device_count - 1}" if facts.device_count > 1 else "cuda:0"
        return f"{said}, but {facts.device_count} GPU(s) are visible ({visible}): choose one of those" + (
            " (docker run --gpus '\"device=N\"' shows host GPU N as cuda:0)" if facts.in_container else ""
        )
    needed = MINIMUM_DRIVER.get(version_tuple(facts.cuda_build)[0])
    if facts.driver is not None and needed is not None and version_tuple(facts.driver) < needed:
        older = (
            f"build the image for it with --build-arg TORCH_INDEX={OLDER_CUDA_INDEX} (CUDA 12.6: driver >= 525)"
            if facts.in_image
            else f"install torch from {OLDER_CUDA_INDEX} (CUDA 12.6: driver >= 525)"
        )
        return (
            f"{said}, but the NVIDIA driver {facts.driver} is too old for this torch's CUDA {facts.cuda_build} "
            f"build, which needs driver >= {'.'.join(map(str, needed))}: upgrade the host's driver, or {older}; "
            f"{on_cpu}"
        )
    if facts.in_container and facts.device_nodes == 0:
        return (
            f"{said}, but this container has no GPU: start it with `docker run --gpus all` (compose: a GPU "
            f"device reservation), which needs the NVIDIA driver and the NVIDIA Container Toolkit on the host; "
            f"{on_cpu}"
        )
    if facts.driver is None and not facts.in_container:
        wanted = f" >= {needed[0]}" if needed else ""
        return (
            f"{said}, but this machine has no NVIDIA driver (no /proc/driver/nvidia): on a machine with an "
            f"NVIDIA GPU, install its driver{wanted} (this torch is built for CUDA {facts.cuda_build}); {on_cpu}"
        )
    driver = f"NVIDIA driver {facts.driver}" if facts.driver else "no NVIDIA driver seen"
    reason = facts.torch_reason or "torch gave no reason"
    return (
        f"{said}, but torch {facts.torch_version} (CUDA {facts.cuda_build}, {driver}) cannot use a GPU: "
        f"{reason}; {on_cpu}"
    )


def check_device(device: str, dtype: str) -> None:
    """Raises DeviceUnavailable with the one line to print when the settings' CUDA device cannot be used."""
    if device.partition(":")[0] != "cuda":
        return
    message = explain(device, dtype, gather())
    if message is not None:
        raise DeviceUnavailable(message)
