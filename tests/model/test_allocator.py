"""txl.kernels.cpu.allocator.keep_freed_memory: a freed multi-megabyte tensor's pages serve the next one (no new page faults)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

PROBE = """
import json, resource, torch
from txl.kernels.cpu.allocator import keep_freed_memory

def faults_per_round():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        torch.empty(3 * 2**20).fill_(1.0)  # 12 MiB: 3,000 pages, freed at once
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20

default = faults_per_round()
kept = keep_freed_memory()
faults_per_round()  # the first round after may still grow the heap
print(json.dumps({"default": default, "kept": kept, "after": faults_per_round()}))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["kept"]
    # glibc's defaults: pages faulted in again every round (about 300 a round here, of 3,000; how many depends on
    # the kernel's huge pages); kept: none
    assert found["default"] > 50, found
    assert found["after"] * 10 < found["default"], found
