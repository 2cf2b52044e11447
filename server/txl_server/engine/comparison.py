"""How the start-up checks (`engine.selfcheck`) compare a decoding path with the eager torch path on the same rows:
the tokens, their log-probs, the hidden states after the step.

In float32 two right paths agree to a few units in the last place, far below `tolerance`. In half precision they
agree only as well as each agrees with the exact result: every path rounds to 8 (bfloat16) or 11 (float16) bits
at each operation, differently (another summation order, fewer roundings in a fused kernel), and the difference
grows with the depth of the model. A fixed limit that an 8-layer model meets with margin, an 18-layer one may
exceed on a healthy GPU, and a kernel that rounds less often than the torch path (the fused decoding body) differs
from it by about the torch path's own error. So in half precision, a difference beyond the limit is judged
against float32 (`Float32Step`: the same rows, fed the same tokens, through a float32 copy of the model on the
CPU): the path is right if it is about as close to float32 as the torch path is (at most FLOAT32_FACTOR times as
far, row by row). A wrong path is far beyond both: off by whole units, or NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .device_failure import is_device_error
from .rows import DecodeOut, release_outputs

# In half precision, how much farther from float32 than the torch path a path may be (row by row): right paths
# round about as often as each other, so their distances to float32 are of one size; a wrong one is off by whole
# units, many times farther.
FLOAT32_FACTOR = 2.0

# The decoding rows' hidden states after the step, in float32, given the reference path's outputs (the tokens
# it fed): one per decoding row (a row the reference returns beyond them, the scored segment, has none).
Float32Step = Callable[[Sequence[DecodeOut]], Sequence[Tensor]]


@dataclass(frozen=True)
class Tolerance:
    """How far a path may be from the eager one and still be right, without asking float32 (figures:
    docs/benchmarks/engine-figures.md)."""

    logprob: float  # |delta log p| of the chosen tokens, in nats
    hidden: float  # |delta hidden| over the largest |hidden| (at least 1)


def tolerance(dtype: torch.dtype) -> Tolerance:
    return Tolerance(1e-3, 1e-3) if dtype == torch.float32 else Tolerance(0.1, 0.05)


@dataclass(frozen=True)
class Comparison:
    """One path against the eager one on the same rows."""

    what: str  # e.g. "triton kernel vs torch path", "graph of 8 rows, top-k 64, top-p"
    tokens_equal: bool = False
    logprob: float = math.inf  # largest |delta log p|
    hidden: float = math.inf  # largest |delta hidden|, relative
    error: str | None = None  # what it raised, when it did not finish
    tolerance: Tolerance = Tolerance(0.0, 0.0)
    # What it raised was an error of the device (the exception itself is not kept: its traceback would keep
    # the dummy rows, and their blocks, alive).
    device_error: bool = False
    # Its distance to float32 over the eager path's, worst row; None where the hidden states were within the
    # tolerance (float32 not asked).
    float32: float | None = None

    @property
    def ok(self) -> bool:
        return (
            self.error is None and self.tokens_equal and self.logprob <= self.tolerance.logprob and self.close
        )

    @property
    def close(self) -> bool:
        """The log-probs and hidden states are as close as a right path's: within the tolerance, or, in half
        precision, about as close to float32 as the eager path."""
        hidden = self.hidden <= self.tolerance.hidden or (
            self.float32 is not None and self.float32 <= FLOAT32_FACTOR
        )
        return self.logprob <= self.tolerance.logprob and hidden

    def problem(self) -> str:
        """What went wrong, in plain words."""
        if self.error is not None:
            return f"{self.what} raised {self.error}"
        parts = [] if self.tokens_equal else ["other tokens"]
        if not self.logprob <= self.tolerance.logprob:
            parts.append(f"log-probs off by {self.logprob:.3g}")
        if not self.close and not self.hidden <= self.tolerance.hidden:
            against = (
                "" if self.float32 is None else f", {self.float32:.3g}x the eager path's distance to float32"
            )
            parts.append(f"hidden states off by {self.hidden:.3g}{against}")
        return f"{self.what} differs from the eager path: {', '.join(parts)}"


def compare_paths(
    what: str,
    run: Callable[[], list[DecodeOut]],
    reference: Callable[[], list[DecodeOut]],
    dtype: torch.dtype,
    float32: Float32Step | None = None,
) -> Comparison:
    """`run` against `reference` on the same rows: tokens, their log-probs, the hidden states after; beyond the
    tolerance in half precision, both against `float32`."""
    limits = tolerance(dtype)
    try:
        got = run()
    except Exception as exc:
        return Comparison(what, error=first_line(exc), tolerance=limits, device_error=is_device_error(exc))
    try:
        expected = reference()
    except BaseException:
        release_outputs(got)
        raise
    try:
        return _compared(what, got, expected, dtype, limits, float32)
    finally:
        release_outputs(got, expected)  # the memories after the step: kept by nothing


def _compared(
    what: str,
    got: list[DecodeOut],
    expected: list[DecodeOut],
    dtype: torch.dtype,
    limits: Tolerance,
    float32: Float32Step | None,
) -> Comparison:
    logprob = max((_distance(a.logprob, b.logprob) for a, b in zip(got, expected, strict=True)), default=0.0)
    hidden = max(
        (_relative(a.last_hidden, b.last_hidden) for a, b in zip(got, expected, strict=True)), default=0.0
    )
    tokens_equal = [a.token for a in got] == [b.token for b in expected]
    ratio = None
    if hidden > limits.hidden and float32 is not None and dtype != torch.float32 and math.isfinite(hidden):
        ratio = _float32_ratio(got, expected, float32(expected), dtype)
    return Comparison(what, tokens_equal, logprob, hidden, None, limits, float32=ratio)


def _relative(a: Tensor, b: Tensor) -> float:
    """|a - b| over the largest |b| (at least 1); NaN counts as infinitely far."""
    scale = max(1.0, float(b.float().abs().max()))
    return float((a.float() - b.float()).abs().nan_to_num(math.inf).max()) / scale


def _float32_ratio(
    got: Sequence[DecodeOut], expected: Sequence[DecodeOut], exact: Sequence[Tensor], dtype: torch.dtype
) -> float:
    """Worst row: the path's distance to float32 over the eager path's. A row the eager path gets within a unit
    of rounding counts as that far (a ratio over nearly nothing says nothing); rows beyond the float32 ones (the
    scored segment) must be within the plain tolerance, else they count as infinitely far."""
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        if i >= len(exact):
            if _relative(a.last_hidden, b.last_hidden) > tolerance(dtype).hidden:
                return math.inf
            continue
        truth = exact[i].float().cpu()
        floor = torch.finfo(dtype).eps * float(truth.norm())
        theirs = float((a.last_hidden.float().cpu() - truth).norm())
        ours = max(float((b.last_hidden.float().cpu() - truth).norm()), floor)
        worst = max(worst, theirs / ours if math.isfinite(theirs) else math.inf)
    return worst


def _distance(a: float, b: float) -> float:
    return math.inf if math.isnan(a) or math.isnan(b) else abs(a - b)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
