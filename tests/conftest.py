"""Shared test helpers. Models are tiny and made by the tests themselves (no downloads)."""

from __future__ import annotations

import os

import torch

# Two threads, as on the CI machine; keeps timings comparable and avoids oversubscription.
torch.set_num_threads(int(os.environ.get("TXL_TEST_THREADS", "2")))
