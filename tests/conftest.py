"""The whole tree's test settings, and its session fixtures (tests/helpers/fixtures.py: a tiny byte-level model
saved for real, a real Redis). Shared helpers live in tests/helpers."""

from __future__ import annotations

import gc
import os

import pytest
import torch

from tests.stages import stage_of

pytest_plugins = ["tests.helpers.fixtures"]

# Two threads for the test process, as on the CI machine.
torch.set_num_threads(int(os.environ.get("TXL_TEST_THREADS", "2")))
# Servers under test (in process or subprocesses, which inherit this) use one torch thread: on a busy 2-core
# machine, two OpenMP threads wait at every barrier for a descheduled peer and requests stall for seconds.
os.environ.setdefault("TXL_THREADS", "1")
# Servers under test admit what they are sent: the suite's own workers, servers and clients share two cores, where
# the latency targets measured at start-up (docs/server.md, "Overload") would refuse a test's streams whenever the
# machine is busy. The admission tests set their targets themselves, and the overload test starts its server
# without these (inherit_txl=False).
os.environ.setdefault("TXL_TTFT_TARGET_SECONDS", "120")
os.environ.setdefault("TXL_TBT_TARGET_SECONDS", "10")


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_after_each_module():
    """Servers made by a module's tests are freed when it ends. A runtime's objects refer to each other, so
    only the cycle collector frees them, and it runs by object counts, not bytes: without this the process
    kept a dozen device pools (2.5 GiB of address space each) and its address space grew past the machine's
    memory."""
    yield
    gc.collect()


def pytest_collection_modifyitems(items):
    """The second stage's tests listed in tests/stages.py are marked `slow` (`bash scripts/test.sh` runs the others)."""
    for item in items:
        if stage_of(item.nodeid) is not None:
            item.add_marker(pytest.mark.slow)
