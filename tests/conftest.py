"""Shared test helpers. Models are tiny and made by the tests themselves (no downloads)."""

from __future__ import annotations

import os

import torch

# Two threads for the test process, as on the CI machine.
torch.set_num_threads(int(os.environ.get("TXL_TEST_THREADS", "2")))
# Servers under test (in process or subprocesses, which inherit this) use one torch thread: on a busy 2-core
# machine, two OpenMP threads wait at every barrier for a descheduled peer and requests stall for seconds.
os.environ.setdefault("TXL_THREADS", "1")
