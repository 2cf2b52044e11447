"""How long an iteration takes on this device, as a function of what it holds: decoding rows and prompt tokens.

`StepTimes` is a line, seconds = a + b * rows + c * tokens, fitted by exponentially weighted least squares to the
iterations the worker runs (their wall time, Python and contention included: what a client's stream sees), over a
prior of iterations measured at start-up (`measure_steps`), which keeps the fit defined when every recent
iteration had the same shape and fades as the served ones accumulate. The admission estimate and the batch's
pacing read it (`admission.pacing.Timing`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Protocol

import torch
from txl import TransfoXLLMHeadModel
from txl.sampling import SamplingParams

from .rows import ChunkRow, DecodeRow
from .runner import ModelRunner
from .state import ModelState

SMOOTHING = 0.02  # each served iteration's weight: the fit follows the last ~50 iterations
PRIOR_WEIGHT = 0.5  # each start-up measurement's weight, which never fades (a floor under the fit)
MIN_SECONDS = 1e-5  # no part of an iteration is free


@dataclass(frozen=True)
class Measured:
    """Start-up measurements: (rows, tokens, seconds) of a few iterations."""

    points: tuple[tuple[int, int, float], ...]
    one_row: float  # seconds of a decoding step of one row
    segment: float  # seconds of feeding one prompt segment alone


class StepTimes:
    def __init__(self, measured: Measured) -> None:
        self.measured = measured
        # Weighted sums of x x^T and x y over x = (1, rows, tokens), y = seconds: served iterations (decaying)...
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xy = [0.0] * 3
        # ... and the start-up prior (constant).
        self._prior_xx = [[0.0] * 3 for _ in range(3)]
        self._prior_xy = [0.0] * 3
        for rows, tokens, seconds in measured.points:
            _add(self._prior_xx, self._prior_xy, (1.0, rows, tokens), seconds, PRIOR_WEIGHT)
        self._fit: tuple[float, float, float] | None = None

    def observe(self, rows: int, tokens: int, seconds: float) -> None:
        """An iteration that decoded `rows` rows and fed `tokens` prompt tokens took `seconds`."""
        keep = 1.0 - SMOOTHING
        for i in range(3):
            self._xy[i] *= keep
            for j in range(3):
                self._xx[i][j] *= keep
        _add(self._xx, self._xy, (1.0, rows, tokens), seconds, 1.0)
        self._fit = None

    def coefficients(self) -> tuple[float, float, float]:
        """(a, b, c): seconds per iteration, per decoding row, per prompt token."""
        if self._fit is None:
            xx = [[self._xx[i][j] + self._prior_xx[i][j] for j in range(3)] for i in range(3)]
            xy = [self._xy[i] + self._prior_xy[i] for i in range(3)]
            a, b, c = _solve(xx, xy) or self._prior_line()
            self._fit = (max(a, MIN_SECONDS), max(b, MIN_SECONDS), max(c, MIN_SECONDS))
        return self._fit

    def _prior_line(self) -> tuple[float, float, float]:
        one, segment = self.measured.one_row, self.measured.segment
        return one / 2, one / 2, segment / max(1, max(t for _, t, _ in self.measured.points))

    def iteration(self, rows: int, tokens: int) -> float:
        a, b, c = self.coefficients()
        return a + b * rows + c * tokens

    def per_token(self) -> float:
        return self.coefficients()[2]


def _add(xx: list[list[float]], xy: list[float], x: tuple[float, float, float], y: float, w: float) -> None:
    for i in range(3):
        xy[i] += w * x[i] * y
        for j in range(3):
            xx[i][j] += w * x[i] * x[j]


def _solve(m: list[list[float]], v: list[float]) -> tuple[float, float, float] | None:
    """m^-1 v for a 3x3 system (Gaussian elimination with pivoting); None if it is singular."""
    a = [[*row, v[i]] for i, row in enumerate(m)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(3):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return (a[0][3] / a[0][0], a[1][3] / a[1][1], a[2][3] / a[2][2])


class Measurable(Protocol):
    """What the measurement runs on (the device worker, before it starts)."""

    model: TransfoXLLMHeadModel
    runner: ModelRunner
    segment_len: int
    max_batch_size: int

    def empty_state(self, mem_len: int) -> ModelState: ...


def measure_steps(worker: Measurable, *, rows: int = 8, repeat: int = 3) -> Measured:
    """Times a few iterations on the worker's runner before it starts (one row, `rows` rows, one prompt segment,
    and both at once), on memories of two segments in the worker's pool. The medians are the prior of
    `StepTimes`, and the targets' defaults (`admission.targets`)."""
    model, segment = worker.model, worker.segment_len
    rows = max(1, min(rows, worker.max_batch_size))
    vocab = model.config.vocab_size
    tokens = [(i * 37 + 11) % vocab for i in range(2 * segment)]
    with torch.inference_mode():
        state = worker.empty_state(model.config.mem_len)
        _, (fed,) = worker.runner.run([], [ChunkRow(state.memory, tokens, None)])
        params = SamplingParams(temperature=1.0)
        decode = [DecodeRow(fed.memory, fed.last_hidden, params, seed=i, counter=0) for i in range(rows)]
        chunk = ChunkRow(fed.memory, tokens[:segment], fed.last_hidden)

        def timed(decoding: list[DecodeRow], chunks: list[ChunkRow]) -> float:
            worker.runner.run(decoding, chunks)  # warm: first calls build kernels and plans
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                worker.runner.run(decoding, chunks)
                times.append(time.perf_counter() - started)
            return statistics.median(times)

        one = timed(decode[:1], [])
        many = timed(decode, [])
        alone = timed([], [chunk])
        both = timed(decode, [chunk])
    points = ((1, 0, one), (rows, 0, many), (0, segment, alone), (rows, segment, both))
    return Measured(points, one, alone)
