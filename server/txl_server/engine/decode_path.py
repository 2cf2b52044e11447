"""The decode path a server serves with (`txl.kernels.DecodePath`: which code runs each part of a decoding step):
the paths it tries at start-up, fastest first, and what it says about the one that serves.

From the settings and the device, the candidates are:

1. Triton's kernels for everything a decoding step runs (attention, the fused layers, the embedding, the
   log-softmax, sampling: `DecodePath.triton`) where Triton runs (a GPU; a CPU only under Triton's interpreter,
   for tests), unless TXL_TRITON_KERNELS=0;
2. on a CPU, the C kernels (attention, prompt segments, the fused decoding layer: `DecodePath.c`) where they
   build, unless TXL_CPU_KERNELS=0;
3. the torch path (a candidate's `torch_variant()`), the reference every candidate is checked against; it always
   stands.

Each has the linear kernels of TXL_LINEAR_KERNEL (on a CPU; by default the fastest of torch's, oneDNN's and the C
loop for each layer shape, measured once on the machine) and the graphs of TXL_CUDA_GRAPHS (by default CUDA graphs
on CUDA). `engine.selfcheck` checks the candidates in order and serves the first that matches its torch variant;
`CheckedPath` is what it chose, why not a faster one, and everything it compared: one log line
(`CheckedPath.line`) and `GET /v1/system` (`engine.device_report`) show it whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from txl.kernels import DecodePath
from txl.kernels.cpu.decode_layer import cpu_decode_layer
from txl.kernels.cpu.linear_choice import KERNELS, C
from txl.kernels.cpu.paged_decode import cpu_paged_decode
from txl.kernels.cpu.prefill_attention import cpu_prefill_attention
from txl.kernels.path import Graphs
from txl.kernels.triton import common as triton_common

from ..settings import Settings
from .comparison import Comparison


@dataclass(frozen=True)
class PathSettings:
    """The settings that choose the candidates."""

    triton: bool = True  # TXL_TRITON_KERNELS
    cpu_kernels: bool = True  # TXL_CPU_KERNELS
    linear: str = "measured"  # TXL_LINEAR_KERNEL: "measured", or "torch", "onednn", "c"
    cuda_graphs: bool | None = None  # TXL_CUDA_GRAPHS; None: on CUDA

    @classmethod
    def of(cls, settings: Settings) -> PathSettings:
        return cls(
            settings.triton_kernels, settings.cpu_kernels, settings.linear_kernel, settings.cuda_graphs
        )


def graphs_setting(cuda_graphs: bool | None, device: torch.device) -> tuple[Graphs, str | None]:
    """How decoding iterations are launched (TXL_CUDA_GRAPHS; default: CUDA graphs on CUDA; on a CPU, switched
    on, their static buffers run eagerly), and why not as graphs."""
    if cuda_graphs is None:
        if device.type == "cuda":
            return "cuda", None
        return "off", f"not a CUDA device ({device.type})"
    if not cuda_graphs:
        return "off", "switched off (TXL_CUDA_GRAPHS=0)"
    return ("cuda" if device.type == "cuda" else "static"), None


def linear_kernels(setting: str, *, cpu_kernels: bool) -> tuple[str, ...]:
    """The kernels a CPU's linear layers may take: the one TXL_LINEAR_KERNEL names, or all of them ("measured"),
    the C loop only with the C kernels on."""
    wanted = KERNELS if setting == "measured" else (setting,)
    allowed = tuple(k for k in wanted if k != C or cpu_kernels)
    return allowed or ("torch",)


@dataclass(frozen=True)
class Candidates:
    """The paths to try, fastest first, the torch path last; and why a faster one is not among them."""

    paths: list[DecodePath]
    skipped: str | None = None


def candidates(device: torch.device, settings: PathSettings) -> Candidates:
    graphs, _ = graphs_setting(settings.cuda_graphs, device)
    linear = linear_kernels(settings.linear, cpu_kernels=settings.cpu_kernels) if device.type == "cpu" else ()
    paths: list[DecodePath] = []
    skipped = None
    if triton_common.available(device):
        if settings.triton:
            paths.append(DecodePath.triton(linear or ("torch",), graphs))
        else:
            skipped = "the Triton kernels are switched off (TXL_TRITON_KERNELS=0)"
    if device.type == "cpu":
        if not settings.cpu_kernels:
            skipped = skipped or "the C kernels are switched off (TXL_CPU_KERNELS=0)"
        elif cpu_paged_decode() is None or cpu_prefill_attention() is None or cpu_decode_layer() is None:
            skipped = skipped or "the C kernels could not be built (no C compiler, or it failed)"
        else:
            paths.append(DecodePath.c(linear, graphs))
    paths.append(DecodePath(linear=linear or ("torch",), graphs=graphs))
    return Candidates(paths, skipped)


@dataclass
class CheckedPath:
    """The decode path that serves, as the start-up checks left it, and why it is not faster where it is not."""

    path: DecodePath
    attention_reason: str | None = None  # why not a faster path's kernels
    graphs_reason: str | None = (
        None  # why decoding iterations are not graphs (unset: see the graphs' own `off`)
    )
    checks: list[Comparison] = field(default_factory=list)  # everything compared at start-up

    @property
    def failures(self) -> list[Comparison]:
        return [c for c in self.checks if not c.ok]

    def line(self) -> str:
        """The start-up log's line: every part of the path, and why not faster."""
        why = [f"kernels: {self.attention_reason}"] if self.attention_reason else []
        why += [f"graphs: {self.graphs_reason}"] if self.graphs_reason else []
        return f"decode path: {self.path.describe()}" + (f" ({'; '.join(why)})" if why else "")
