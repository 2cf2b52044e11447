"""When the worker took a job in and what it computed for it: the times a request's trace draws as the job's
queue, prefill and decode spans (telemetry/spans.py: `job_spans`).

Stamped on the worker's thread with `time.time_ns()` (the clock traces use), a few integers per segment or token
whether anyone traces or not; read on the event loop once the job has ended (its last event is delivered after
every stamp: `call_soon_threadsafe` orders them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class JobTiming:
    created: int = field(
        default_factory=time.time_ns
    )  # handed to the worker (jobs are made as they are sent)
    admitted: int = 0  # the worker took it from its inbox into the scheduler's queues (0: never)
    fed_at: int = 0  # its last input segment was fed
    segments: int = 0
    fed_tokens: int = 0
    decoded_at: int = 0  # its last token was sampled
    steps: int = 0  # iterations that sampled a token for it (one token each)

    def admit(self) -> None:
        self.admitted = time.time_ns()

    def fed(self, tokens: int) -> None:
        self.segments += 1
        self.fed_tokens += tokens
        self.fed_at = time.time_ns()

    def decoded(self) -> None:
        self.steps += 1
        self.decoded_at = time.time_ns()
