"""The shape of each forward, paced to the time-between-tokens target: how many rows the decoding batch may hold,
how many prompt tokens ride beside them, and how much time flex and batch prompts may take from running streams.

- **Rows** (`rows_cap`): the batch grows while one more row keeps an iteration (with the event loop's delivery
  lag) within 1 - PREFILL_SHARE of the target, and within KNEE_STEPS steps of one row: past that knee (a CPU's,
  where each row costs a good part of the step's fixed cost) a row adds less to the tokens per second than it
  adds to every stream's wait, and a longer queue is better served by shorter steps. It shrinks when
  it no longer fits; a margin either way (hysteresis), so that the cap does not move at every step and push a
  row out and back in. Rows past the cap wait
  for a place (running rows are never starved: a row in the batch keeps its place until it ends, unless fair
  share or a higher lane claims it, and then it is the first to come back).
- **Prompt tokens** (`chunk_tokens`): what the target leaves beside the decoding rows, at least `min_chunk`, so
  that prompts always progress.
- **Background prompts** (`background_allowed`): while interactive streams decode, flex and batch prompt segments
  take at most BACKGROUND_SHARE of the worker's time: a segment runs only when the time it and those before it
  added to their iterations (measured: the iteration's time over what its streams' part takes) has been paid
  back by (1 - share) / share times as much time without them. A stream then keeps about 1 - share of the
  tokens per second it has alone (less what the segments' traces in the caches cost its next steps), beside a
  scoring of any length; the scoring still gets its share, in whole segments (a segment's fixed costs are paid
  once, and the pause it adds is within the TBT target).

The step times come from `Timing` (the device's measured iterations: `engine.step_times.StepTimes`).
"""

from __future__ import annotations

from typing import Protocol

from .targets import LatencyTargets

PREFILL_SHARE = 0.25  # of the TBT target, kept for prompt segments beside a full batch
# A decoding iteration grows to at most this many one-row steps (a GPU's never gets there): on the 2-core CPU
# this was measured on (docs/benchmarks/load.md), 8-12 rows of the bundled model, where its goodput peaked.
KNEE_STEPS = 6.0
GROW_MARGIN = 0.9  # a row is added when the iteration stays under this share of what the target allows
SHRINK_MARGIN = 1.1  # and taken away when it passes this share of it
# While streams decode, flex and batch prompt segments take at most this share of the time. Half (a segment, then as
# long without one) left a stream beside a 120 kB scoring 37-58% of its tokens per second on the 2-core CPU
# (docs/benchmarks/load.md): each segment also slows the stream's next steps (caches), so the bar of half was luck.
# A fifth keeps it about three quarters, with room for that; the scoring then progresses at a fifth of its speed
# alone while a stream runs beside it, and at full speed between streams.
BACKGROUND_SHARE = 0.2


class Timing(Protocol):
    def iteration(self, rows: int, tokens: int) -> float:
        """Seconds of an iteration decoding `rows` rows and feeding `tokens` prompt tokens."""
        ...

    def per_token(self) -> float:
        """Seconds each prompt token adds to an iteration."""
        ...


class Pacing:
    def __init__(self, targets: LatencyTargets, timing: Timing, *, min_chunk: int) -> None:
        self.targets = targets
        self.timing = timing
        self.min_chunk = max(1, min_chunk)
        self.lag = 0.0  # seconds the event loop takes to deliver a step's tokens (set by the worker)
        self._cap = 1
        self._debt = 0.0  # seconds without background prompts that streams are owed for the time those took

    def _row_budget(self) -> float:
        knee = KNEE_STEPS * self.timing.iteration(1, 0)
        return min((1 - PREFILL_SHARE) * self.targets.tbt - self.lag, knee)

    def rows_cap(self, limit: int) -> int:
        """The most decoding rows an iteration may hold now (at least one; at most `limit`)."""
        budget = self._row_budget()
        iteration = self.timing.iteration
        cap = min(max(self._cap, 1), max(1, limit))
        while cap < limit and iteration(cap + 1, 0) <= GROW_MARGIN * budget:
            cap += 1
        while cap > 1 and iteration(cap, 0) > SHRINK_MARGIN * budget:
            cap -= 1
        self._cap = cap
        return cap

    def chunk_tokens(self, rows: int, limit: int) -> int:
        """Prompt tokens an iteration may feed beside `rows` decoding rows (at most `limit`): what the target
        leaves; all of `limit` when nothing decodes."""
        if rows == 0:
            return max(1, limit)
        spare = self.targets.tbt - self.lag - self.timing.iteration(rows, 0)
        tokens = int(spare / max(self.timing.per_token(), 1e-9))
        return max(min(self.min_chunk, limit), min(limit, tokens))

    def background_allowed(self, streams: bool) -> bool:
        """Whether flex and batch prompt segments may run in this iteration (`streams`: interactive rows decode)."""
        if not streams:
            self._debt = 0.0
        return self._debt <= 0.0

    def ran(self, seconds: float, *, rows: int, tokens: int, background_tokens: int, streams: bool) -> None:
        """After an iteration of `seconds` that decoded `rows` rows and fed `tokens` prompt tokens, of which
        `background_tokens` flex or batch ones (`streams`: interactive rows decoded in it). What the background
        tokens took is the iteration's measured time over the step times' estimate without them, and at least
        their own estimate (which alone missed a 128-token segment's time beside a stream by 10-20% on the CPU)."""
        if not streams:
            self._debt = 0.0
        elif background_tokens:
            without = self.timing.iteration(rows, tokens - background_tokens)
            took = max(seconds - without, background_tokens * self.timing.per_token())
            self._debt += took * (1 - BACKGROUND_SHARE) / BACKGROUND_SHARE
        else:
            self._debt = max(0.0, self._debt - seconds)
