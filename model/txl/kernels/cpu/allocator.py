"""The C allocator's settings for inference on a CPU: keep freed memory instead of handing it back to the OS.

A prompt segment's attention makes tensors of a few megabytes every layer (scores [H, T, K], the positional
product, the feed-forward's inner activations), frees them, and makes them again in the next layer. glibc's
malloc serves such sizes from fresh `mmap`s or gives the top of its heap back to the OS on each free (its
thresholds adapt, but not to this pattern), so every layer's tensors are new pages: faulted in and zeroed by the
kernel before torch writes them, which made a prompt segment on a CPU take about twice as long (docs/model.md;
`python -m bench cpu` measures it). vLLM's CPU backend asks for tcmalloc for the same reason; this needs no
preloaded library.

`keep_freed_memory()` sets glibc's thresholds for this process: nothing under 32 MiB (glibc's largest allowed)
is mapped on its own, freed memory is not trimmed, and the heap grows 64 MiB at a time. The cost is that the
process keeps its peak heap (a segment's attention tensors: docs/model.md gives sizes). Elsewhere
(musl, macOS, Windows) it does nothing. A server calls it at start-up; a library import never does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

SETTINGS = {
    M_MMAP_THRESHOLD: 32 * 2**20,  # glibc's maximum on 64-bit: larger allocations are still mapped
    M_TRIM_THRESHOLD: 2**31 - 1,  # never give the heap's top back (an int: mallopt takes one)
    M_TOP_PAD: 64 * 2**20,
}


@functools.cache
def keep_freed_memory() -> bool:
    """Sets this process's allocator to keep freed memory (see the module's docstring); True where it could."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: other libcs' mallopt take other parameters)
    except (OSError, AttributeError, TypeError):
        log.info("not glibc: the allocator keeps its own settings")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = all(mallopt(parameter, value) == 1 for parameter, value in SETTINGS.items())
    if not done:
        log.warning("glibc refused an allocator setting: freed memory may still go back to the OS")
    return done
