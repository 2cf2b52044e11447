"""OpenAI's `logprobs` object of a completion, built token by token."""

from __future__ import annotations

from txl.tokenizers import Tokenizer

from ...sessions.events import TopLogprobs
from ...sessions.stateless import PromptScores
from .protocol import CompletionLogprobs


class LogprobsBuilder:
    """OpenAI's `logprobs` object: token strings, their log-probs, top alternatives and text offsets.

    As OpenAI's: an echoed prompt's first token has null for its log-prob and its alternatives (nothing before
    it is part of the prompt), and a token's alternatives hold the token itself when it is not among the top
    `logprobs` (so they may hold one more)."""

    def __init__(self, tokenizer: Tokenizer, top: int) -> None:
        self.tokenizer, self.top = tokenizer, top
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []
        self.offset = 0

    def add(self, token_id: int, text: str, logprob: float | None, top: TopLogprobs | None) -> None:
        self.tokens.append(text)
        self.token_logprobs.append(logprob)
        alternatives = None
        if top is not None:
            alternatives = {self.tokenizer.token_text(t): lp for t, lp in top}
            if logprob is not None and all(t != token_id for t, _ in top):
                alternatives[self.tokenizer.token_text(token_id)] = logprob
        self.top_logprobs.append(alternatives)
        self.text_offset.append(self.offset)
        self.offset += len(text)

    def add_prompt(self, scores: PromptScores) -> None:
        decoder = self.tokenizer.decoder()
        pieces = [decoder.push(t) for t in scores.token_ids]
        if pieces:
            pieces[-1] += decoder.flush()
        for i, (token_id, piece) in enumerate(zip(scores.token_ids, pieces, strict=True)):
            if i == 0:
                self.add(token_id, piece, None, None)
                continue
            logprob = scores.logprobs[i] if i < len(scores.logprobs) else None
            alternatives = scores.top[i] if (scores.top is not None and i < len(scores.top)) else None
            self.add(token_id, piece, logprob, alternatives)

    def build(self, start: int = 0) -> CompletionLogprobs:
        """The entries from `start` on (a streamed chunk's), or all of them."""
        return CompletionLogprobs(
            tokens=self.tokens[start:],
            token_logprobs=self.token_logprobs[start:],
            top_logprobs=self.top_logprobs[start:] if self.top else None,
            text_offset=self.text_offset[start:],
        )
