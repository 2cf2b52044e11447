"""Prometheus text as the tests read it."""

from __future__ import annotations

import re


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 if absent); labels must match exactly those given."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        base, _, label_text = series.partition("{")
        if base != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', label_text))
        if found == labels:
            return float(value)
    return 0.0
