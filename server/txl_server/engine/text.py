"""Turning sampled tokens into streamed text: incremental detokenization and stop strings.

Stop strings are matched on the text, across token boundaries, and are not part of the output. Text that might
be the start of a stop string is held back until the next tokens settle it.
"""

from __future__ import annotations

from collections.abc import Sequence

from txl.tokenizers import IncrementalDecoder


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""

    @property
    def pending(self) -> bool:
        return bool(self._held)

    def feed(self, text: str) -> tuple[str, bool]:
        """New text -> (text now final, whether a stop string was found). After a stop, feed no more."""
        buffer = self._held + text
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return buffer[: min(hits)], True
        keep = self._longest_stop_prefix_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def finish(self) -> str:
        held, self._held = self._held, ""
        return held

    def _longest_stop_prefix_suffix(self, buffer: str) -> int:
        """Length of the longest end of `buffer` that begins some stop string (so may still become one)."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:n]):
                    best = n
                    break
        return best


class GenerationText:
    """Detokenizer + stop matcher for one generation. `push` per token; `finish` at the end."""

    def __init__(self, decoder: IncrementalDecoder, stops: Sequence[str]) -> None:
        self._decoder = decoder
        self._stops = StopMatcher(stops)
        self.text = ""  # everything released so far (the output)
        self.stopped = False

    def push(self, token_id: int) -> str:
        released, self.stopped = self._stops.feed(self._decoder.push(token_id))
        self.text += released
        return released

    def finish(self) -> str:
        """Releases what was held back: the decoder's tail (unless a stop string ended the text) and any
        partial stop-string prefix that never completed."""
        rest = ""
        if not self.stopped:
            released, self.stopped = self._stops.feed(self._decoder.flush())
            rest = released + ("" if self.stopped else self._stops.finish())
        self.text += rest
        return rest

    @property
    def may_hold_text(self) -> bool:
        """Whether `finish` could still release text (so the last token's event should wait for it)."""
        return self._stops.pending or bool(getattr(self._decoder, "has_pending", True))
