"""Scoring text with a model: log p(token | everything before), segment by segment, in constant memory.

A scoring state is (memory, last hidden state): the memory lets the next segment attend to the past, and the
last hidden state predicts the first token of the next segment. A document of any length is scored with memory
bounded by `mem_len`, whatever its length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .kernels import REFERENCE, DecodePath
from .memory import Memory
from .model import TransfoXLLMHeadModel


def nll(logprob: float, tokens: int) -> float:
    """Mean negative log-likelihood per token (nats)."""
    return -logprob / max(tokens, 1)


def perplexity(logprob: float, tokens: int) -> float:
    return math.exp(min(nll(logprob, tokens), 700.0))  # capped: exp overflows past ~709


def bits_per(logprob: float, units: int) -> float:
    """Bits per unit (byte, character, word) of a text whose tokens' log-probabilities sum to `logprob`."""
    return -logprob / math.log(2) / max(units, 1)


def shifted(hidden: Tensor, tokens: Sequence[int], last_hidden: Tensor | None) -> tuple[Tensor, list[int]]:
    """What predicts what in a segment: position t predicts token t+1, and the previous segment's last hidden
    state predicts token 0 (without one, nothing predicts token 0 and it is not scored).

    hidden [T, D] of the segment's tokens -> (predictors [M, D], the tokens they predict [M]), M = T or T-1."""
    inner = hidden[:-1]
    if last_hidden is None:
        return inner, list(tokens[1:])
    return torch.cat([last_hidden[None, :], inner]), list(tokens)


@dataclass
class ScoreResult:
    logprob: float  # summed natural-log probability of the scored tokens
    scored: int  # tokens with a prediction (all but the first when scoring starts from nothing)
    token_logprobs: list[float] | None
    memory: Memory
    last_hidden: Tensor | None  # [D]: predicts the token after the document

    @property
    def nll(self) -> float:
        return nll(self.logprob, self.scored)

    def bits_per(self, units: int) -> float:
        return bits_per(self.logprob, units)


@torch.inference_mode()
def advance(
    model: TransfoXLLMHeadModel,
    tokens: Tensor,
    memory: Memory,
    last_hidden: Tensor | None,
    path: DecodePath = REFERENCE,
) -> tuple[Tensor, Memory, Tensor]:
    """tokens [T] after `memory` -> (log p of each token [T] (NaN where nothing predicts it), memory, last hidden [D]),
    through the kernels `path` names (txl.kernels.path)."""
    hidden, new_memory = model(tokens[None, :], memory, path=path)  # [1, T, D]
    hidden = hidden[0]
    ids = tokens.tolist()
    predictors, targets = shifted(hidden, ids, last_hidden)
    logprobs = model.target_log_probs(predictors, tokens.new_tensor(targets), targets, path=path)
    if last_hidden is None:
        logprobs = torch.cat([logprobs.new_full((1,), math.nan), logprobs])
    return logprobs, new_memory, hidden[-1].clone()


def score_tokens(
    model: TransfoXLLMHeadModel,
    tokens: Sequence[int] | Tensor,
    *,
    mem_len: int | None = None,
    segment_len: int | None = None,
    memory: Memory | None = None,
    last_hidden: Tensor | None = None,
    token_logprobs: bool = False,
    progress: Callable[[int, int], None] | None = None,
    path: DecodePath = REFERENCE,
) -> ScoreResult:
    """Scores `tokens` segment by segment (through the kernels `path` names); `progress(done, total)` is called
    after each segment. The memory returned is the caller's to release (`memory`, if given, stays theirs too);
    the memories between segments are released as it goes."""
    ids = torch.as_tensor(tokens, dtype=torch.long, device=model.device)
    segment_len = segment_len or model.config.segment_len
    if memory is None:
        memory = model.empty_memory(mem_len=mem_len)
    total = 0.0
    scored = 0
    per_token: list[float] | None = [] if token_logprobs else None
    for start in range(0, ids.numel(), segment_len):
        chunk = ids[start : start + segment_len]
        before = memory
        logprobs, memory, last_hidden = advance(model, chunk, memory, last_hidden, path)
        if start:  # the memory of the segment before: this call's own
            before.release()
        valid = logprobs[~torch.isnan(logprobs)]
        total += float(valid.double().sum())
        scored += valid.numel()
        if per_token is not None:
            per_token.extend(logprobs.tolist())
        if progress is not None:
            progress(min(start + segment_len, ids.numel()), ids.numel())
    return ScoreResult(total, scored, per_token, memory, last_hidden)
