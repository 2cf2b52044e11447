"""The CPU decode kernel: built once per machine with the system C compiler, called through ctypes.

Why native code: decoding attends one query per row over every row's memory, which lives in pool blocks. In
plain torch that means gathering each row's blocks into a dense copy first (index_select), then two products:
the copy alone moves twice the bytes attention needs. The kernel reads each block in place, once. ctypes
releases the GIL during the call; with more than one torch thread the call splits its rows over torch's own
OpenMP team (see the C file).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from .rows import DecodeRows

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode.c")
# -ffp-contract=fast: ISO C mode (-std=c11) keeps a * b + c as two roundings, so without it GCC emits no fused
# multiply-adds at all; with them the fused decode layer ran 8% faster at 8 rows (same at 1-4, bound by reads).
FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp-simd", "-std=c11", "-shared", "-fPIC"]
# TXL_CPU_KERNEL_ISA=avx2 builds the kernels without AVX-512 on a CPU that has it: with oneDNN, ATen and MKL
# limited likewise, what an AVX2-only CPU runs (`python -m bench cpu` measures that class so).
AVX2_ONLY = ["-mno-avx512f"]
# q .. out; B, H, S, NB, bs, Dh, P, threads; scratch, its floats per thread
_ARGS = [ctypes.c_void_p] * 9 + [ctypes.c_int64] * 8 + [ctypes.c_void_p, ctypes.c_int64]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def cache_dir() -> Path:
    """Where compiled kernels (and measured linear kernel choices, txl.kernel_choice) are kept."""
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
    found, the build fails, or `TXL_CPU_KERNELS=0` is set (callers then take torch's path). `openmp`: built with
    -fopenmp where that builds, and without it where not (its parallel regions then run in one thread)."""
    if os.environ.get("TXL_CPU_KERNELS", "1") == "0":
        return None
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


class PagedDecodeKernel:
    """Attention of one query per row over paged keys/values (see paged_decode.c for the contract)."""

    def __init__(self, library: ctypes.CDLL, threaded: bool) -> None:
        self._functions = {
            torch.float32: library.txl_paged_decode_f32_threads,
            torch.bfloat16: library.txl_paged_decode_bf16_threads,
        }
        for function in self._functions.values():
            function.argtypes = _ARGS
            function.restype = None
        # Whether a call may split its rows over torch's thread team: only where the library was built with OpenMP
        # and the process maps one OpenMP runtime, torch's (openmp_runtimes).
        self.threaded = threaded

    def supports(self, dtype: torch.dtype) -> bool:
        return dtype in self._functions

    def __call__(self, q: Tensor, bd: Tensor, keys: Tensor, values: Tensor, rows: DecodeRows) -> Tensor:
        """q [B, H, Dh] float32, bd [H, B, P] float32, keys/values [H, NB, bs, Dh] -> [B, H, Dh] float32."""
        table, starts, key_lengths, windows = rows.table, rows.starts, rows.key_lengths, rows.windows
        batch, heads, d_head = q.shape
        _, n_blocks, block_size, _ = keys.shape
        width, n_pos = table.size(1), bd.size(2)
        q, bd, table = q.contiguous(), bd.contiguous(), table.contiguous()
        out = torch.empty_like(q)
        items = batch * heads
        # At least 4 (row, head) items a thread: fewer cost more to hand out than they save.
        threads = min(torch.get_num_threads(), max(1, items // 4)) if self.threaded else 1
        scratch = torch.empty(threads, width * block_size)
        pointers = [t.data_ptr() for t in (q, bd, keys, values, table, starts, key_lengths, windows, out)]
        sizes = [batch, heads, width, n_blocks, block_size, d_head, n_pos]
        self._functions[keys.dtype](*pointers, *sizes, threads, scratch.data_ptr(), width * block_size)
        return out


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


@functools.cache
def cpu_paged_decode() -> PagedDecodeKernel | None:
    """The kernel for this machine, built on first use; None where it cannot be (attention then uses torch)."""
    library = build_library(SOURCE, openmp=True)
    if library is None:
        return None
    return PagedDecodeKernel(library, shares_torchs_threads(SOURCE.name))
