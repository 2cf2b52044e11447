"""How long an iteration takes on this device, as a function of what it holds: decoding rows and prompt tokens.

`StepTimes` is a line, seconds = scale * (a + b * rows + c * tokens). Its shape (a, b, c) is fitted at start-up
to a few iterations of known rows and tokens, measured alone (`measure_steps`), where each part is well
determined; its `scale` follows the iterations the worker runs (their wall time, Python and the machine's other
work included: what a client's stream sees), as a running mean of each one's time over the shape's. One scale
for the whole line, because what slows a server down (a busy machine, the event loop's share of the GIL) slows
every part of its steps alike; and because served iterations rarely vary their rows enough to fit a slope of
their own (a slope fitted to iterations of four rows would say anything about forty). The admission estimate and
the batch's pacing read it (`admission.pacing.Timing`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Protocol

import torch
from txl import TransfoXLLMHeadModel
from txl.sampling import SamplingParams

from ..admission.targets import LatencyTargets, latency_targets
from ..settings import Settings
from .rows import ChunkRow, DecodeRow, release_outputs
from .runner import ModelRunner
from .state import ModelState

log = logging.getLogger(__name__)

SMOOTHING = 0.05  # each served iteration's weight in the scale: it follows the last ~20 iterations
SCALE_BOUNDS = (0.2, 50.0)  # what one iteration may say of the device: a GC pause is not a new machine
MIN_SECONDS = 1e-6  # no part of an iteration is free


@dataclass(frozen=True)
class Measured:
    """Start-up measurements: (rows, tokens, seconds) of a few iterations."""

    points: tuple[tuple[int, int, float], ...]
    one_row: float  # seconds of a decoding step of one row
    segment: float  # seconds of feeding one prompt segment alone

    def line(self) -> tuple[float, float, float]:
        """(a, b, c): the least-squares line through the points, each part at least MIN_SECONDS."""
        xx = [[0.0] * 3 for _ in range(3)]
        xy = [0.0] * 3
        for rows, tokens, seconds in self.points:
            x = (1.0, float(rows), float(tokens))
            for i in range(3):
                xy[i] += x[i] * seconds
                for j in range(3):
                    xx[i][j] += x[i] * x[j]
        solved = _solve(xx, xy)
        if solved is None:  # too few shapes measured: one row's step split evenly, a segment's per token
            segment_tokens = max(1, max(t for _, t, _ in self.points))
            solved = (self.one_row / 2, self.one_row / 2, self.segment / segment_tokens)
        a, b, c = solved
        return max(a, MIN_SECONDS), max(b, MIN_SECONDS), max(c, MIN_SECONDS)


class StepTimes:
    def __init__(self, measured: Measured) -> None:
        self.measured = measured
        self.shape = measured.line()
        self.scale = 1.0

    def observe(self, rows: int, tokens: int, seconds: float) -> None:
        """An iteration that decoded `rows` rows and fed `tokens` prompt tokens took `seconds`."""
        low, high = SCALE_BOUNDS
        ratio = min(high, max(low, seconds / self._shaped(rows, tokens)))
        self.scale += SMOOTHING * (ratio - self.scale)

    def _shaped(self, rows: int, tokens: int) -> float:
        a, b, c = self.shape
        return a + b * rows + c * tokens

    def coefficients(self) -> tuple[float, float, float]:
        """(a, b, c): seconds per iteration, per decoding row, per prompt token, now."""
        a, b, c = self.shape
        return a * self.scale, b * self.scale, c * self.scale

    def iteration(self, rows: int, tokens: int) -> float:
        return self.scale * self._shaped(rows, tokens)

    def per_token(self) -> float:
        return self.scale * self.shape[2]


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

    def pace(self, targets: LatencyTargets, measured: Measured) -> None: ...


def pace_worker(worker: Measurable, settings: Settings) -> None:
    """Admission and pacing to the latency targets: those set, or measured for the device now (before the
    worker starts)."""
    measured = measure_steps(worker)
    targets = latency_targets(
        ttft=settings.ttft_target_seconds,
        tbt=settings.tbt_target_seconds,
        one_row_step=measured.one_row,
        one_segment=measured.segment,
    )
    worker.pace(targets, measured)
    log.info("latency targets: %s", targets.describe())


def measure_steps(worker: Measurable, *, rows: int = 16, repeat: int = 5) -> Measured:
    """Times a few iterations on the worker's runner before it starts (one row, `rows` rows, one prompt segment,
    and both at once), on memories of two segments in the worker's pool: the shape of `StepTimes`, and the
    targets' defaults (`admission.targets`). The fastest of `repeat` runs of each: what the device does when the
    machine lets it (a busy machine's noise would give the line any slope; the scale follows the rest)."""
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
            release_outputs(*worker.runner.run(decoding, chunks))  # warm: first calls build kernels and plans
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                outputs = worker.runner.run(decoding, chunks)
                times.append(time.perf_counter() - started)
                release_outputs(*outputs)
            return min(times)

        one = timed(decode[:1], [])
        many = timed(decode, [])
        alone = timed([], [chunk])
        both = timed(decode, [chunk])
        fed.memory.release()
    points = ((1, 0, one), (rows, 0, many), (0, segment, alone), (rows, segment, both))
    return Measured(points, one, alone)
