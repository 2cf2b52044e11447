"""The prefix cache: the states of recently read prompts at segment-grid boundaries, reused by any request of the
same owner that begins with the same tokens.

A session's state after `k * grid` positions is a function of those positions' tokens alone (txl.window), so a
request whose tokens begin like an earlier one's starts from the earlier one's state at the longest boundary they
share, and feeds only the rest: a hit gives exactly what a miss computes. Unlike block-level prefix caches (vLLM,
SGLang), which reuse only whole blocks of keys and values and miss below a block, a Transformer-XL state is small
and fixed, so any boundary is a complete resume point.

Keys chain: the key of boundary k hashes the key of boundary k-1 and the tokens between them, salted with the owner
(one tenant's text never answers, nor times, another's), the model and the memory length. Entries keep, besides
the state, the log-probs of their segment's tokens, so that a request that wants every prompt token scored (/v1/score,
echo with logprobs) can take them from the cache too when every boundary before the hit is still cached.

Entries share most of their blocks (the windows of neighbouring boundaries overlap); the byte budget counts a
block once however many entries hold it. The least recently used entry goes first among those whose next boundary
is not cached (a radix tree's leaves, as in SGLang): a chain is cut from its end, so what stays is a prefix whose
every token keeps its log-prob. Concurrent requests for the
same prefix compute it once: the first builds, the others wait for it and then hit.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from txl.tokenizers import Tokenizer

from ..admission.classes import RequestClass
from ..engine.jobs import AdvanceJob, AdvanceResult, Event, ProgressEvent, job_result
from ..engine.state import ModelState
from ..engine.worker import Worker
from .state_cache import TierUsage


@dataclass
class CachedBoundary:
    state: ModelState
    logprobs: list[float]  # of the tokens between the previous boundary and this one
    parent: str | None = None  # the previous boundary's key (None: the first)


@dataclass(frozen=True)
class Hit:
    fed: int  # positions the hit's state holds (a multiple of the grid)
    state: ModelState
    logprobs: list[float] | None  # of every token before `fed`, when every earlier boundary is still cached


class PrefixCache:
    def __init__(self, *, budget_bytes: int, grid: int, salt: str) -> None:
        self.budget = budget_bytes
        self.grid = grid
        self.salt = salt
        self._entries: OrderedDict[str, CachedBoundary] = OrderedDict()  # least recently used first
        self._children: dict[str, int] = {}  # key -> cached entries whose parent it is
        self._usage = TierUsage(budget_bytes)
        self._building: dict[str, asyncio.Future[None]] = {}

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def used(self) -> int:
        return self._usage.used

    def states(self) -> list[ModelState]:
        return [entry.state for entry in self._entries.values()]

    def keys(self, owner: str, mem_len: int, ids: Sequence[int]) -> list[str]:
        """The key of each boundary within `ids` (positions fed from the start): key k for ids[: (k+1) * grid]."""
        digest = hashlib.blake2b(f"{self.salt}\x00{owner}\x00{mem_len}".encode(), digest_size=16).digest()
        keys = []
        for end in range(self.grid, len(ids) + 1, self.grid):
            chunk = ",".join(map(str, ids[end - self.grid : end])).encode()
            digest = hashlib.blake2b(digest + chunk, digest_size=16).digest()
            keys.append(digest.hex())
        return keys

    def lookup(self, keys: Sequence[str], *, limit: int, with_logprobs: bool) -> Hit | None:
        """The longest cached boundary among `keys` holding at most `limit` positions (with `with_logprobs`, only
        one whose earlier boundaries are all cached, so that every token before it has its log-prob)."""
        for k in range(min(len(keys), limit // self.grid), 0, -1):
            entry = self._entries.get(keys[k - 1])
            if entry is None:
                continue
            logprobs: list[float] | None = None
            if with_logprobs:
                chain = [self._entries.get(key) for key in keys[:k]]
                if any(c is None for c in chain):
                    continue
                logprobs = [x for c in chain if c is not None for x in c.logprobs]
            for key in keys[:k]:
                if key in self._entries:
                    self._entries.move_to_end(key)
            return Hit(k * self.grid, entry.state, logprobs)
        return None

    def boundaries_within_budget(self, block_bytes: int, block_size: int) -> int:
        """How many consecutive boundaries of one prompt the budget holds at most (each adds a grid's positions
        to the one before; one block more for the start token's)."""
        return self.budget * block_size // (self.grid * block_bytes) + 1 if self.enabled else 0

    def put(self, key: str, boundary: CachedBoundary) -> None:
        """Caches a boundary (its state's hold passes to the cache, which releases it when the entry goes), then
        drops least recently used entries until the cache is within its budget."""
        if not self.enabled or key in self._entries:
            if key in self._entries:
                self._entries.move_to_end(key)
            boundary.state.release()
            return
        self._entries[key] = boundary
        self._usage.add(boundary.state)
        if boundary.parent is not None:
            self._children[boundary.parent] = self._children.get(boundary.parent, 0) + 1
        while self._usage.used > self.budget and self._entries:
            self.evict_one()

    def evict_one(self) -> bool:
        """Drops the least recently used entry whose next boundary is not cached; False if there is none."""
        victim = next((k for k in self._entries if not self._children.get(k)), None)
        if victim is None:
            return False
        entry = self._entries.pop(victim)
        self._usage.remove(entry.state)
        entry.state.release()  # its blocks go back now, unless a session or a job holds them too
        if entry.parent is not None:
            left = self._children[entry.parent] - 1
            if left:
                self._children[entry.parent] = left
            else:
                del self._children[entry.parent]
        return True

    def clear(self) -> None:
        while self.evict_one():
            pass

    # ------------------------------------------------------------------ one build per prefix

    def building(self, keys: Sequence[str]) -> asyncio.Future[None] | None:
        """A build in flight that will cache the longest of `keys` any build in flight covers."""
        for key in reversed(keys):
            future = self._building.get(key)
            if future is not None:
                return future
        return None

    def start_build(self, keys: Sequence[str]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in keys:
            self._building.setdefault(key, future)
        return future

    def end_build(self, keys: Sequence[str], future: asyncio.Future[None]) -> None:
        for key in keys:
            if self._building.get(key) is future:
                del self._building[key]
        if not future.done():
            future.set_result(None)


@dataclass(frozen=True)
class Read:
    """A prompt read through the cache: the state after it (the caller's hold: it releases it), how many positions
    came from the cache, and (when scores were asked for) the log-prob of every token (NaN for the first, which
    nothing predicts), their sum and the top alternatives if asked."""

    state: ModelState
    cached: int
    token_logprobs: list[float] | None = None
    logprob: float = 0.0
    token_top: list | None = None


class PromptReader:
    """Reads prompts: from an empty memory primed with the start token, through the prefix cache. Every request
    that starts from nothing (a new session, a stateless completion or score, a preloaded memory's document) reads
    its prompt here, so a prompt reads the same wherever it is sent."""

    def __init__(self, cache: PrefixCache, worker: Worker, start_id: int) -> None:
        self.cache = cache
        self.worker = worker
        self.start_id = start_id

    async def read(
        self,
        owner: str,
        tokens: list[int],
        *,
        mem_len: int,
        scores: bool = False,
        top_logprobs: int = 0,
        progress: Callable[[int, int], None] | None = None,
        through_cache: bool = True,
        klass: RequestClass | None = None,
    ) -> Read:
        """Feeds the start token and `tokens` after an empty memory of `mem_len`, from the longest prefix the
        cache holds (with `through_cache`), and caches the boundaries it reaches. `progress(done, total)` counts
        the prompt's own tokens (not the start token). With `scores`, only a hit whose every token's log-prob is
        cached counts. Requests for top alternatives of prompt tokens read the whole prompt (the cache keeps only
        each token's own log-prob), and still fill the cache."""
        cache, empty = self.cache, self.worker.empty_state(mem_len)
        ids = [self.start_id, *tokens]
        use = cache.enabled and through_cache
        keys = cache.keys(owner, empty.mem_len, ids) if use else []
        hit = None
        while use:
            hit = (
                cache.lookup(keys, limit=len(ids), with_logprobs=scores)
                if not (scores and top_logprobs)
                else None
            )
            covered = hit.fed // cache.grid if hit is not None else 0
            pending = cache.building(keys[covered:])
            if pending is None:
                break
            await asyncio.shield(pending)  # the same prefix is being read: wait for it, then look again
        fed = hit.fed if hit is not None else 0
        start, rest = (hit.state if hit is not None else empty), ids[fed:]
        building = keys[fed // cache.grid :] if use else []
        future = cache.start_build(building) if building else None

        def report(done: int) -> None:  # positions fed, the start token's included
            if progress is not None:
                progress(max(0, done - 1), len(tokens))

        def on_event(event: Event) -> None:
            if isinstance(event, ProgressEvent):
                report(fed + event.done)

        if fed:
            report(fed)  # what the cache held is done already
        try:
            job = AdvanceJob(
                start,
                rest,
                token_logprobs=scores,
                top_logprobs=top_logprobs,
                report_progress=progress is not None,
                boundaries=cache.grid if use else 0,
                keep_boundaries=cache.boundaries_within_budget(
                    self.worker.pool.block_nbytes, self.worker.pool.block_size
                ),
                klass=klass,
            )
            result: AdvanceResult = await job_result(self.worker, job, on_event)
            parent = keys[fed // cache.grid - 1] if fed else None
            for key, boundary in zip(building, result.boundaries, strict=False):
                cache.put(key, CachedBoundary(boundary.state, boundary.logprobs, parent))
                parent = key
            for boundary in result.boundaries[len(building) :]:
                boundary.state.release()
        finally:
            if future is not None:
                cache.end_build(building, future)
        if not scores:
            return Read(result.state, fed)
        cached = hit.logprobs if hit is not None and hit.logprobs is not None else []
        assert result.token_logprobs is not None
        total = math.fsum(x for x in cached if not math.isnan(x)) + result.logprob
        return Read(result.state, fed, [*cached, *result.token_logprobs], total, result.token_top)


def start_token(tokenizer: Tokenizer) -> int:
    """What every state starts from: the tokenizer's separator (<eos>, else a newline), so that a text's first
    real token is predicted like any other, from the start of a document."""
    return tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.encode("\n")[0]
