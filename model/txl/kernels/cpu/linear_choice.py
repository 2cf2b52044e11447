"""Which kernel computes a linear layer of a given shape on this CPU: measured once, remembered on disk.

A choice is made per entry (out x in features, dtype, input rows bucket, torch threads) by timing every candidate
kernel on this machine, interleaved, and keeping the fastest by its best time (the least disturbed by other
processes on a shared machine). Torch's kernel is kept unless another is clearly faster (`MARGIN`): it needs no
second copy of the weight.

Choices are cached in one JSON file per machine under the user's cache directory (`TXL_KERNEL_CACHE`, else
`$XDG_CACHE_HOME/txl/kernels`, else `~/.cache/txl/kernels`), so that a process measures only what no earlier one
on this machine did. A machine is its CPU's name, the vector units torch and oneDNN may use (which
`ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA` and `MKL_ENABLE_INSTRUCTIONS` change), and the torch version. A file
that does not parse, was written for another machine, or holds entries this code would not write is ignored
(entry by entry); delete the file to measure again. An entry names the kernels it was chosen among, so that a
kernel that becomes available later (a C compiler installed) is measured then.
"""

from __future__ import annotations

import contextlib

try:
    import fcntl
except ImportError:  # not on Windows: no cross-process lock there
    fcntl = None  # type: ignore[assignment]
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

TORCH = "torch"
ONEDNN = "onednn"
C = "c"
KERNELS = (TORCH, ONEDNN, C)
# 3: the C kernel splits its outputs over torch's threads, so choices measured with more than one thread before
# (the C kernel then on one) are measured again. 4: the kernels' names are the decode path's ("torch", "c"; they
# were "plain", "native").
FORMAT = 4
# Another kernel replaces torch's only when this much faster: below it, timing noise decides.
MARGIN = 0.05
# Rows a linear layer is measured at; an input takes the choice of the nearest in log scale (see `rows_bucket`).
ROW_BUCKETS = (1, 4, 16, 64, 256)


@dataclass(frozen=True)
class Entry:
    """A linear layer's shape as a kernel sees it: what one choice holds for."""

    out_features: int
    in_features: int
    dtype: torch.dtype
    rows: int  # a bucket (see rows_bucket)
    threads: int

    @property
    def key(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.out_features}x{self.in_features} {dtype} rows={self.rows} threads={self.threads}"


# timer(entry, candidates) -> seconds per call of each candidate (name -> a call of it on a sample input)
Timer = Callable[[Entry, Mapping[str, Callable[[], object]]], dict[str, float]]


def rows_bucket(rows: int) -> int:
    """The measured row count standing for `rows`: 1, 2-7 -> 4, 8-31 -> 16, 32-127 -> 64, 128 and more -> 256."""
    if rows < 2:
        return 1
    if rows < 8:
        return 4
    if rows < 32:
        return 16
    if rows < 128:
        return 64
    return 256


@dataclass(frozen=True)
class Machine:
    """What a measurement holds for: another machine (or the same one limited to fewer vector units) may
    choose differently."""

    cpu: str  # the CPU's model name
    vector: str  # vector units: torch's dispatch level and the CPU's flags that matter (AVX-512, AMX, bf16)
    onednn_isa: str  # ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA), "" when not limited
    mkl_isa: str  # MKL_ENABLE_INSTRUCTIONS, "" when not limited
    bfloat16: bool  # whether oneDNN computes bfloat16 natively (see txl.kernels.cpu.linear.cpu_runs_bfloat16)
    torch: str

    @property
    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @property
    def file_name(self) -> str:
        return f"linear-{hashlib.sha256(self.key.encode()).hexdigest()[:16]}.json"


_VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx_ne_convert", "amx_tile", "amx_bf16")


def this_machine(bfloat16: bool) -> Machine:
    cpu, flags = "unknown", set[str]()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    dispatch = torch.backends.cpu.get_cpu_capability()  # honours ATEN_CPU_CAPABILITY
    vector = " ".join([dispatch, *(f for f in _VECTOR_FLAGS if f in flags)])
    return Machine(
        cpu=cpu,
        vector=vector,
        onednn_isa=os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "",
        mkl_isa=os.environ.get("MKL_ENABLE_INSTRUCTIONS", ""),
        bfloat16=bfloat16,
        torch=torch.__version__,
    )


def last_level_cache_bytes() -> int:
    """The largest CPU cache's size (sysfs), or 32 MiB where it cannot be read."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        with contextlib.suppress(OSError, ValueError):
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 * 2**20)


ROUNDS = 3


def measure(entry: Entry, candidates: Mapping[str, Callable[[], object]]) -> dict[str, float]:
    """Best seconds per run of each candidate over ROUNDS interleaved rounds (a busy spell slows every candidate
    alike), after one warm-up run each (packing weights, creating primitives, faulting pages in). A run is a
    pass over copies of the layer (see txl.kernels.cpu.linear), as a decode step passes over its layers.

    With one torch thread the clock is the thread's CPU time: the time other processes take the core is not
    the kernel's (on a shared machine, wall-clock minima of millisecond calls varied severalfold between runs)."""
    clock = time.thread_time if entry.threads == 1 else time.perf_counter
    for run in candidates.values():
        run()
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(ROUNDS):
        for name, run in candidates.items():
            started = clock()
            run()
            best[name] = min(best[name], clock() - started)
    return best


class KernelChoices:
    """Each entry's kernel: remembered, read from this machine's cache file, or measured (and saved)."""

    def __init__(
        self,
        machine: Machine,
        directory: Path | None,
        *,
        timer: Timer = measure,
    ) -> None:
        self.machine = machine
        self.path = directory / machine.file_name if directory is not None else None
        self.timer = timer
        self._choices: dict[str, str] | None = None  # read from disk on first use
        self._lock = threading.Lock()
        self.measured: dict[str, dict[str, float]] = {}  # this process's timings by key, for reports

    def choose(self, entry: Entry, candidates: Mapping[str, Callable[[], object]]) -> str:
        """The kernel for `entry` among `candidates` (name -> a call on a sample input, for timing)."""
        if len(candidates) == 1:
            return next(iter(candidates))
        with self._lock:
            # A choice holds among the kernels it was made from: one more (a compiler installed since) is measured.
            key = f"{entry.key} of {'/'.join(candidates)}"
            choices = self._loaded()
            known = choices.get(key)
            if known is not None and known in candidates:
                return known
            with self._machine_lock():
                # Another process may have measured it while this one waited: its choice is taken, so that every
                # process on the machine computes with the same kernels (a session moved between two servers
                # started together continues bit for bit).
                choices.update(self._read())
                known = choices.get(key)
                if known is not None and known in candidates:
                    return known
                return self._measure(key, entry, candidates, choices)

    def _measure(
        self, key: str, entry: Entry, candidates: Mapping[str, Callable[[], object]], choices: dict[str, str]
    ) -> str:
        """Times the candidates, keeps the fastest (torch's unless another is clearly faster), saves it."""
        seconds = self.timer(entry, candidates)
        self.measured[key] = seconds
        choice = min(candidates, key=lambda name: seconds[name] * (1 if name == TORCH else 1 + MARGIN))
        choices[key] = choice
        self._save(key, choice)
        log.debug("linear %s: %s (%s)", key, choice, seconds)
        return choice

    @contextlib.contextmanager
    def _machine_lock(self) -> Iterator[None]:
        """Held while measuring: one process at a time on this machine (a lock file beside the cache file, taken
        with flock, released by the kernel if the process dies). Without a usable directory, no lock."""
        if self.path is None or fcntl is None:
            yield
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path.with_suffix(".lock"), "a")  # noqa: SIM115 (held across the yield)
        except OSError:
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _loaded(self) -> dict[str, str]:
        if self._choices is None:
            self._choices = self._read()
        return self._choices

    def _read(self) -> dict[str, str]:
        """This machine's valid entries in the cache file; nothing from a file that is missing, does not parse
        or belongs to another machine."""
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if (
            not isinstance(data, dict)
            or data.get("format") != FORMAT
            or data.get("machine") != self.machine.key
        ):
            return {}
        entries = data.get("choices")
        if not isinstance(entries, dict):
            return {}
        return {k: v for k, v in entries.items() if isinstance(k, str) and v in KERNELS}

    def _save(self, key: str, choice: str) -> None:
        """Adds one entry to the file, merged with what other processes wrote meanwhile; atomic (a reader sees
        the old file or the new one). A directory that cannot be written only costs a measurement next time."""
        if self.path is None:
            return
        choices = {**self._read(), key: choice}
        data = {"format": FORMAT, "machine": self.machine.key, "choices": dict(sorted(choices.items()))}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("could not save linear kernel choices to %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
