"""Native kernels built for this machine: compiled once with the system C compiler, cached on disk, loaded
through ctypes.

Each C file beside this module is one kernel; its Python wrapper (the module of the same name) declares the
functions it exports and calls them. `load_kernel(source, Wrapper)` is how a wrapper gets its library: `source`
compiled on first use (`-O3 -march=native`, cached under `cache_dir()` by a key over the source, the headers it
includes, the compiler and its flags, and this CPU), and None where it cannot be (no C compiler, a failed build):
a decode path then names torch's kernels instead (txl.kernels.path). ctypes releases the GIL during a call. A kernel built
with `-fopenmp` runs its parallel regions on torch's own OpenMP team (team.h) where the process maps that one
runtime alone (`shares_torchs_threads`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch

log = logging.getLogger(__name__)

# -ffp-contract=fast: ISO C mode (-std=c11) keeps a * b + c as two roundings, so without it GCC emits no fused
# multiply-adds at all (the fused decode layer is faster with them: docs/model.md).
FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp-simd", "-std=c11", "-shared", "-fPIC"]
# TXL_CPU_KERNEL_ISA=avx2 builds the kernels without AVX-512 on a CPU that has it: with oneDNN, ATen and MKL
# limited likewise, what an AVX2-only CPU runs (`python -m bench cpu` measures that class so).
AVX2_ONLY = ["-mno-avx512f"]
# The suffixes of a kernel's entry points by the dtype of the tensors they read (bfloat16 as uint16 bits).
DTYPE_SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def cache_dir() -> Path:
    """Where compiled kernels (and measured linear kernel choices, txl.kernels.cpu.linear_choice) are kept."""
    root = os.environ.get("TXL_KERNEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "txl", "kernels"
    )
    return Path(root)


def _flags() -> list[str]:
    return FLAGS + (AVX2_ONLY if os.environ.get("TXL_CPU_KERNEL_ISA", "").lower() == "avx2" else [])


def _build(compiler: str, source: Path, extra: list[str]) -> Path:
    # The compiler is the system's own (CC or cc on PATH), run with fixed arguments.
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout  # noqa: S603
    flags = _flags() + extra
    text = source.read_text()
    # The headers it includes from beside it (team.h) are part of what is built: a change to one rebuilds it.
    headers = [(source.parent / name).read_text() for name in re.findall(r'^#include "([^"]+)"', text, re.M)]
    key = hashlib.sha256(
        "\n".join(
            [text, *headers, compiler, version, " ".join(flags), _cpu_flags(), platform.machine()]
        ).encode()
    ).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        subprocess.run(  # noqa: S603
            [compiler, *flags, str(source), "-o", str(built), "-lm"],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(built, target)  # atomic: concurrent builders race harmlessly
    return target


def build_library(source: Path, openmp: bool = False) -> ctypes.CDLL | None:
    """`source` compiled for this machine on first use (cached on disk) and loaded; None where no C compiler is
    found or the build fails. `openmp`: built with -fopenmp where that builds, and without it where not (its
    parallel regions then run in one thread)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.info("no C compiler found: %s is not used, torch's kernels are", source.name)
        return None
    if openmp:
        try:
            return ctypes.CDLL(str(_build(compiler, source, ["-fopenmp"])))
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            log.info("%s without OpenMP (%s): one thread per call", source.name, detail.strip()[:200])
    try:
        return ctypes.CDLL(str(_build(compiler, source, [])))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        log.warning(
            "could not build %s (%s): using torch's kernels instead", source.name, detail.strip()[:500]
        )
        return None


_OPENMP_RUNTIMES = ("libgomp", "libiomp", "libomp")


def openmp_runtimes() -> set[str]:
    """The OpenMP runtimes mapped into this process (their files), from /proc/self/maps; empty where it cannot
    be read. One runtime means a kernel built with -fopenmp shares torch's thread team; two would each keep a team
    of their own, and their threads would fight for the cores."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return set()
    paths = {line.split(maxsplit=5)[-1] for line in lines if line.count(" ") >= 5}
    return {p for p in paths if Path(p).name.startswith(_OPENMP_RUNTIMES)}


def shares_torchs_threads(kernel: str) -> bool:
    """Whether a kernel built with OpenMP may split its work over torch's thread team: true where this process
    maps one OpenMP runtime (torch's, which the kernel's libgomp.so.1 bound to); else it runs in one thread, and
    the log says why."""
    runtimes = openmp_runtimes()
    if len(runtimes) == 1:
        return True
    log.warning(
        "%s runs in one thread: %d OpenMP runtimes are loaded (%s), not torch's alone",
        kernel,
        len(runtimes),
        ", ".join(sorted(runtimes)) or "none found",
    )
    return False


class LoadedLibrary:
    """One kernel's library, built and loaded: its functions, declared, and how many threads a call may use."""

    def __init__(self, library: ctypes.CDLL, threaded: bool) -> None:
        self._library = library
        # Whether a call may split its work over torch's thread team: built for OpenMP, in a process that maps one
        # OpenMP runtime, torch's (shares_torchs_threads).
        self.threaded = threaded

    def function(self, name: str, argtypes: Sequence[Any], restype: Any = None) -> Any:
        """The exported function `name`, declared with these argument types and result type."""
        function = getattr(self._library, name)
        function.argtypes = list(argtypes)
        function.restype = restype
        return function

    def team(self, most: int) -> int:
        """Threads a call runs on now: torch's thread count, at most `most` and at least one, where the call
        shares torch's team; else one."""
        return max(1, min(torch.get_num_threads(), most)) if self.threaded else 1


class Kernel:
    """What every kernel's wrapper holds: its library, and whether a call may run on torch's thread team."""

    def __init__(self, library: LoadedLibrary) -> None:
        self.library = library
        self.threaded = library.threaded


class KernelByDtype(Kernel):
    """A kernel with one entry point per dtype of the tensors it reads: `ENTRY` names them, `{}` standing for
    the dtype's suffix (DTYPE_SUFFIXES), each taking `ARGS`."""

    ENTRY: ClassVar[str]
    ARGS: ClassVar[Sequence[Any]]

    def __init__(self, library: LoadedLibrary) -> None:
        super().__init__(library)
        self.functions = {
            dtype: library.function(self.ENTRY.format(suffix), self.ARGS)
            for dtype, suffix in DTYPE_SUFFIXES.items()
        }

    def supports(self, dtype: torch.dtype) -> bool:
        return dtype in self.functions


Wrapper = TypeVar("Wrapper")


def load_kernel(
    source: Path, wrapper: Callable[[LoadedLibrary], Wrapper], *, openmp: bool = False
) -> Wrapper | None:
    """`wrapper` over `source` built for this machine (see `build_library`) and loaded; None where it cannot be
    built (callers then take torch's path). `openmp`: its calls may run on torch's thread team where that is
    shared (`shares_torchs_threads`)."""
    library = build_library(source, openmp=openmp)
    if library is None:
        return None
    return wrapper(LoadedLibrary(library, openmp and shares_torchs_threads(source.name)))
