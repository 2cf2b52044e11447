"""What the worker keeps of a job while it runs: an ingesting task feeds a job's input segment by segment (an
AdvanceJob, or a GenerateJob's prompt); a decoding task samples a generation's tokens, one per iteration.

The scheduler orders them by their request's class (`lane`, `tenant`, `rank`: admission.classes; the youngest of
the lowest lane is preempted first: `arrival`) and asks each how many fresh blocks its next row takes
(`new_blocks`); the outputs update them with what each step computed.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field

from torch import Tensor
from txl import Memory
from txl.paged.rows import new_blocks
from txl.tokenizers import Tokenizer

from ..admission.classes import SERVER, Lane
from .jobs import AdvanceJob, GenerateJob, TokenEvent
from .launched import Launched
from .rows import ChunkRow, DecodeRow, TopLogprobs
from .state import ModelState
from .text import GenerationText

_arrivals = itertools.count()


class Classed:
    """What the scheduler reads of a task's request class (none: the server's own work, interactive)."""

    job: AdvanceJob | GenerateJob

    @property
    def tenant(self) -> str:
        klass = self.job.klass
        return klass.tenant if klass is not None else SERVER

    @property
    def lane(self) -> Lane:
        klass = self.job.klass
        return klass.lane if klass is not None else Lane.INTERACTIVE

    @property
    def rank(self) -> int:
        klass = self.job.klass
        return klass.rank if klass is not None else 1

    @property
    def class_name(self) -> str:
        klass = self.job.klass
        return klass.name if klass is not None else "default"


@dataclass(eq=False)
class DecodeTask(Classed):
    """A generation sampling its tokens (after its prompt, if it has one, was fed by an IngestTask)."""

    job: GenerateJob
    state: ModelState  # its own once decoding (its prompt's task holds it before): handed to the result
    text: GenerationText
    seed: int
    # From the prompt phase, for the result: its scores, and its top log-probs when asked for.
    prompt_logprobs: list[float] | None = None
    prompt_top: list[TopLogprobs | None] | None = None
    token_ids: list[int] = field(default_factory=list)
    sampled_logprobs: list[float] = field(default_factory=list)
    held: TokenEvent | None = None  # the last token's event, kept while text may still be released after it
    arrival: int = field(default_factory=lambda: next(_arrivals))
    # Its step in flight, with overlapped decoding: (that iteration, the memory and hidden state after it).
    ahead: tuple[Launched, Memory, Tensor] | None = None
    replay: int = (
        0  # its first tokens' events are not sent: its client has them (a preempted job's run again)
    )

    @classmethod
    def start(
        cls, job: GenerateJob, state: ModelState, tokenizer: Tokenizer, *, seed: int | None = None
    ) -> DecodeTask:
        decoder = tokenizer.decoder(list(state.tail) + job.prompt)
        if seed is None:
            seed = job.sampling.seed if job.sampling.seed is not None else secrets.randbits(63)
        return cls(job, state, GenerationText(decoder, job.stop), seed)

    @property
    def cancelled(self) -> bool:
        return self.job.cancelled

    @property
    def produced(self) -> bool:
        """It has sampled a token (a row that left the batch comes back before rows that never ran)."""
        return bool(self.token_ids) or self.ahead is not None

    @property
    def progressed(self) -> bool:
        """Its state holds blocks of its own (beyond its job's input): a prompt fed, or a token sampled."""
        return bool(self.job.prompt) or self.produced

    @property
    def remaining(self) -> int:
        """Tokens it may still sample."""
        return max(0, self.job.max_tokens - len(self.token_ids))

    def next_row(self) -> DecodeRow:
        """The row it feeds next: after its step in flight, if it has one."""
        memory, last = self.state.memory, self.state.last_hidden
        counter = len(self.token_ids)
        if self.ahead is not None:
            _, memory, last = self.ahead
            counter += 1
        assert last is not None  # decoding states always have one
        return DecodeRow(memory, last, self.job.sampling, self.seed, counter, self.job.top_logprobs)

    def new_blocks(self, tokens: int, claimed: set[int]) -> int:
        memory = self.ahead[1] if self.ahead is not None else self.state.memory
        return new_blocks(memory.pool, memory.rows[0], tokens, claimed)

    def release(self) -> None:
        """What it holds goes back (it failed, was cancelled or re-queued): its state, its step in flight's."""
        self.state.release()
        if self.ahead is not None:
            self.ahead[1].release()


@dataclass(eq=False)
class IngestTask(Classed):
    """A job feeding its input segment by segment: an AdvanceJob, or a GenerateJob's prompt."""

    job: AdvanceJob | GenerateJob
    state: ModelState  # its own: released as it advances, handed to the result at the end
    tokens: list[int]
    score: bool  # log p of every input token
    top_k: int  # with score: the k most likely tokens at each position
    cursor: int = 0
    arrival: int = field(default_factory=lambda: next(_arrivals))  # the youngest is preempted first
    # Scoring, kept on the device until the job ends: one tensor of log-probs per segment.
    logprobs: list[Tensor] = field(default_factory=list)
    top: list[TopLogprobs | None] = field(default_factory=list)
    boundaries: int = 0  # > 0: segments end on multiples of it (AdvanceJob.boundaries)
    # The states of at most this many are kept (AdvanceJob.keep_boundaries).
    keep_boundaries: int | None = None
    # (state, index in `logprobs` of its segments' end) at each boundary reached
    reached: list[tuple[ModelState, int]] = field(default_factory=list)
    then: DecodeTask | None = None  # a prompt's generation, which decodes once the prompt is fed

    @classmethod
    def advance(cls, job: AdvanceJob, state: ModelState) -> IngestTask:
        top_k = job.top_logprobs if job.token_logprobs else 0
        return cls(
            job,
            state,
            job.tokens,
            True,
            top_k,
            boundaries=job.boundaries,
            keep_boundaries=job.keep_boundaries,
        )

    @classmethod
    def prompt(cls, generation: DecodeTask) -> IngestTask:
        job = generation.job
        top_k = job.top_logprobs if job.prompt_logprobs else 0
        return cls(job, generation.state, job.prompt, job.prompt_logprobs, top_k, then=generation)

    @property
    def cancelled(self) -> bool:
        return self.job.cancelled

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.cursor

    @property
    def rows_after(self) -> int:
        """The decoding rows its request opens once this input is fed (the scheduler's fair shares)."""
        if self.then is not None:
            return 1
        klass = self.job.klass
        return klass.decode_rows if klass is not None else 0

    @property
    def progressed(self) -> bool:
        """Its state holds blocks of its own (beyond its job's input): a segment fed."""
        return self.cursor > 0

    @property
    def keeps_another_boundary(self) -> bool:
        return self.keep_boundaries is None or len(self.reached) < self.keep_boundaries

    @property
    def chunk_limit(self) -> int:
        """The most tokens its next segment may feed: up to the next boundary, if it keeps them."""
        if not self.boundaries:
            return self.pending
        return self.boundaries - self.state.fed % self.boundaries

    def next_chunk(self, n: int) -> ChunkRow:
        """The row feeding its next `n` tokens."""
        state = self.state
        tokens = self.tokens[self.cursor : self.cursor + n]
        return ChunkRow(state.memory, tokens, state.last_hidden, self.score, self.top_k)

    def new_blocks(self, tokens: int, claimed: set[int]) -> int:
        memory = self.state.memory
        return new_blocks(memory.pool, memory.rows[0], tokens, claimed)

    def release(self) -> None:
        """What it holds goes back (it failed, was cancelled or re-queued): its state and the boundaries'."""
        self.state.release()
        for state, _ in self.reached:
            state.release()
        self.reached = []
