"""The latency targets the server admits work to: time to first token (TTFT) and time between tokens (TBT).

Set by TXL_TTFT_TARGET_SECONDS and TXL_TBT_TARGET_SECONDS; where not set, measured for the device at start-up
from its own step times (`engine.step_times.measure_steps`), so that a slow device is not held to a fast one's
numbers: at least the goodput yardstick of docs/benchmarks/load.md (1 s and 50 ms), and at least what one
session alone needs with room to batch beside it (TBT_STEPS steps of one row; TTFT_SEGMENTS segments of a prompt
and a few gaps).
"""

from __future__ import annotations

from dataclasses import dataclass

TTFT_FLOOR_SECONDS = 1.0
TBT_FLOOR_SECONDS = 0.05
TBT_STEPS = 3  # a TBT target leaves room for a batch: three times one row's step
TTFT_SEGMENTS = 4  # and a TTFT target for a prompt of a few segments, queued behind others


@dataclass(frozen=True)
class LatencyTargets:
    ttft: float  # seconds from a request's arrival at the worker to its first token
    tbt: float  # seconds between two tokens of a stream
    measured: bool = False  # derived from the device's step times (not both set)

    def describe(self) -> str:
        how = "measured for this device" if self.measured else "set"
        return (
            f"time to first token {self.ttft * 1000:.0f} ms, between tokens {self.tbt * 1000:.0f} ms ({how})"
        )


def latency_targets(
    *, ttft: float | None, tbt: float | None, one_row_step: float, one_segment: float
) -> LatencyTargets:
    """The targets: those set, else derived from the device's step of one decoding row and its forward of one
    prompt segment (seconds)."""
    tbt_target = tbt if tbt is not None else max(TBT_FLOOR_SECONDS, TBT_STEPS * one_row_step)
    ttft_target = (
        ttft
        if ttft is not None
        else max(TTFT_FLOOR_SECONDS, TTFT_SEGMENTS * one_segment + TBT_STEPS * tbt_target)
    )
    return LatencyTargets(ttft_target, tbt_target, measured=ttft is None or tbt is None)
