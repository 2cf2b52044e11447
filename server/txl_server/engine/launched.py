"""A decoding iteration sent to the device (`Launched`) and the page-locked buffers its tokens come back through
(`ReadBackTurns`): the worker sends an iteration, then collects the one before while the device runs it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Generic, TypeVar

import torch
from torch import Tensor
from txl import Memory

from .rows import DecodeOut


@dataclass(frozen=True)
class ReadBack:
    host: Tensor  # [n, 2] float64: each row's token and its log-prob, once `ready`
    ready: torch.cuda.Event | None  # None: already there
    turn: int | None = None  # the page-locked buffer it lands in (`ReadBackTurns`), given back once read


class ReadBackTurns:
    """The two buffers the iterations' tokens and log-probs are read back through, in turn: the next iteration's
    copy may land while this one's is still unread, so one iteration may be in flight while the next is sent, and
    no more (a third would overwrite the first's tokens before the host read them). Taking a buffer that is still
    unread raises: the worker's overlapped loop collects each iteration before it sends the one after next."""

    def __init__(self, rows: int, *, pinned: bool) -> None:
        self.buffers = [torch.zeros((rows, 2), dtype=torch.float64, pin_memory=pinned) for _ in range(2)]
        self.unread = [False, False]
        self.turn = 0

    def check_free(self) -> None:
        """Raises unless the next buffer is free (at most one iteration is in flight)."""
        if self.unread[self.turn]:
            raise RuntimeError(
                "two decoding iterations are already in flight: collect one before sending another"
            )

    def take(self) -> tuple[int, Tensor]:
        self.check_free()
        turn = self.turn
        self.unread[turn] = True
        self.turn ^= 1
        return turn, self.buffers[turn]

    def give_back(self, turn: int) -> None:
        self.unread[turn] = False

    @property
    def in_flight(self) -> int:
        return sum(self.unread)


@dataclass(frozen=True)
class Launched:
    """A decoding iteration sent to the device. Known at once: each row's memory after it (host bookkeeping) and
    its new hidden state (on the device); the sampled tokens once read back."""

    memories: list[Memory]
    hidden: Sequence[Tensor]
    read_back: ReadBack | None
    outputs: list[DecodeOut] | None = None  # an iteration that ran eagerly: all known already
    turns: ReadBackTurns | None = None  # where `read_back` landed, given back once read

    @classmethod
    def done(cls, outputs: list[DecodeOut]) -> Launched:
        return cls([o.memory for o in outputs], [o.last_hidden for o in outputs], None, outputs)

    def collect(self) -> list[DecodeOut]:
        """The rows' sampled tokens and their log-probs (waits for the device if it has not finished)."""
        if self.outputs is not None:
            return self.outputs
        read_back = self.read_back
        assert read_back is not None
        try:
            if read_back.ready is not None:
                read_back.ready.synchronize()
            # One conversion: [token, log-prob] pairs of Python floats (a token id is exact in a float64)
            tokens, logprobs = zip(*read_back.host.tolist(), strict=True)
        finally:
            if self.turns is not None and read_back.turn is not None:
                self.turns.give_back(read_back.turn)
        n = len(self.memories)
        outputs = list(
            map(DecodeOut, map(int, tokens), logprobs, repeat(None, n), self.memories, self.hidden)
        )
        object.__setattr__(self, "outputs", outputs)  # read once: its buffer may now hold another iteration's
        return outputs


T = TypeVar("T")


@dataclass(frozen=True)
class Pending(Generic[T]):
    """A decoding iteration sent and not yet read back, and the tasks whose rows it runs."""

    launched: Launched
    tasks: list[T]
    started: float
