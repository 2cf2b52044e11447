"""`python -m bench host` measures with a probe run in a fresh process on a tree's own code: the probe must work on
this tree (its imports follow the code's homes), or the benchmark breaks unnoticed until someone runs it."""

from __future__ import annotations

from bench import host
from bench.common import ROOT


def test_the_host_probe_runs_on_this_tree():
    measured = host.probe(ROOT, steps=12, batches=(1, 2))
    assert set(measured) == {1, 2}
    assert all(ms > 0 for ms in measured.values())
