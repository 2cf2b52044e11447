"""Decoding iterations as CUDA graphs: sample, feed the sampled token, keep the new hidden state, in one replay.

A decode step of a few dozen rows is hundreds of small kernels; launched one by one from Python, the GPU waits
for the host most of the time. Captured once per batch-size bucket (and sampling variant) into a CUDA graph,
the whole iteration is one launch (vLLM's and gpt-fast's approach). Everything a graph reads lives in buffers
that never move: the rows' hidden states and sampling parameters, their block tables and write positions
(`txl.paged.step.StaticDecodeStep`); each iteration copies its rows into them, pads the batch with rows that
touch only a scratch block, replays, and reads back the sampled ids once.

Randomness is an input, not generator state: each row's number is a hash of (seed, token index) computed inside
the graph (txl.sampling), so replays draw fresh numbers and a seeded request is reproducible.

The set of graphs is bounded and captured at start-up (`capture_all`, called by `engine.selfcheck`, which also
replays each against the eager path before the server says it is ready): batch-size buckets times top-k buckets
(none, <= 64, <= 512) times top-p (used or not). Nothing is captured while serving: shapes outside the set (a
larger top-k, rows asking for top log-probs, iterations feeding prompt segments, rows longer than the buffers)
run eagerly (`ModelRunner`), and a failure turns the graphs off for good (`turn_off`), never retried.

On a CPU the same buffers run eagerly (a decode path's graphs "static": "capturing" builds the static steps), which
is how the tests check this path where no GPU is present. The body takes the kernels of the decode path the graphs
are made on (`txl.kernels.DecodePath`), the one the eager runner has.
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from txl import BlockPool, Memory, TransfoXLLMHeadModel
from txl.kernels import DecodePath
from txl.paged.decode_plan import DecodePlan, RowArrays, plan_decode
from txl.paged.pool import BlockTable
from txl.paged.rows import resting_blocks
from txl.paged.staging import StagedInputs
from txl.paged.step import StaticDecodeStep
from txl.sampling import PADDING, RowParams, RowValues, SamplingParams, sample_rows
from txl.window import keeps_after, windows_at

from .launched import Launched, ReadBack, ReadBackTurns
from .rows import DecodeOut, DecodeRow

log = logging.getLogger(__name__)

# The largest top-k of a graph's rows, rounded up to one of these (0: no row limits k). A larger top-k (below
# the vocabulary) is rare and runs eagerly: each bucket is another graph per batch size, captured at start-up.
TOP_K_BUCKETS = (64, 512)

# (rows, top-k bucket, any row uses top-p): what a captured graph is specialised for.
GraphKey = tuple[int, int, bool]

# A decoding iteration run eagerly (`ModelRunner.decode` of a runner without graphs).
EagerDecode = Callable[[Sequence[DecodeRow]], list[DecodeOut]]


def buckets(max_batch_size: int) -> list[int]:
    """Batch sizes a graph is captured for: powers of two up to the largest batch."""
    sizes, size = [], 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    return [*sizes, max_batch_size]


def top_k_buckets(vocab: int) -> list[int]:
    """The top-k buckets graphs are captured for: 0 (no limit) and TOP_K_BUCKETS, capped below the vocabulary
    (a top-k of the whole vocabulary is no limit)."""
    return sorted({0, *(min(k, vocab - 1) for k in TOP_K_BUCKETS)})


def top_k_bucket(rows: Sequence[DecodeRow], vocab: int) -> int | None:
    """The smallest bucket covering every row's top-k, or None when one is beyond the largest (run eagerly)."""
    limited = [r.params.top_k for r in rows if 0 < r.params.top_k < vocab]
    if not limited:
        return 0
    return next((k for k in top_k_buckets(vocab) if k >= max(limited)), None)


class SamplingInputs:
    """The rows' sampling parameters for a graph, encoded as the eager path encodes them (`txl.sampling.RowValues`)
    and staged like the step's inputs (one non-blocking copy per dtype, txl.paged.staging); padding rows are
    `txl.sampling.PADDING` (greedy, unlimited)."""

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.rows, self.vocab = rows, vocab
        self.ints = StagedInputs(
            {"top_k": (rows,), "seeds": (rows,), "counters": (rows,)}, torch.long, device
        )
        self.floats = StagedInputs({"temperature": (rows,), "top_p": (rows,)}, torch.float32, device)
        # Greedy as the flags the sampler reads (no comparison in the body), sent with the floats.
        self.flags = StagedInputs({"greedy": (rows,)}, torch.bool, device)
        self.padding = RowValues.encode([PADDING], [0], vocab)
        # A batch decodes the same rows, with the same parameters, step after step: what is already in a buffer
        # is not written again. Per host buffer of the integers, the (parameters, seeds) it holds; the rows whose
        # floats the device holds. (Parameters are kept, not their ids: an id may be reused once one is freed.)
        self._ints_rows: list[tuple[tuple[SamplingParams, ...], tuple[int, ...]] | None] = [None, None]
        self._floats_rows: tuple[SamplingParams, ...] | None = None
        self.load([], [], [])

    def load(self, params: Sequence[SamplingParams], seeds: Sequence[int], counters: Sequence[int]) -> None:
        n, rows = len(params), (tuple(params), tuple(seeds))
        ints_stale = self._ints_rows[self.ints.turn] != rows
        floats_stale = self._floats_rows != rows[0]
        values = RowValues.encode(params, seeds, self.vocab) if n and (ints_stale or floats_stale) else None
        pad = self.padding
        ints = self.ints.host()
        if ints_stale:
            ints["top_k"][n:] = pad.top_k[0]
            ints["seeds"][n:], ints["counters"][n:] = pad.seeds[0], 0
            if values is not None:
                ints["top_k"][:n] = values.top_k
                ints["seeds"][:n] = values.seeds
            self._ints_rows[self.ints.turn] = rows
        ints["counters"][:n] = counters
        self.ints.send()
        if floats_stale:
            floats, flags = self.floats.host(), self.flags.host()
            floats["temperature"][n:], floats["top_p"][n:] = pad.temperature[0], pad.top_p[0]
            flags["greedy"][n:] = pad.greedy[0]
            if values is not None:
                floats["temperature"][:n] = values.temperature
                floats["top_p"][:n] = values.top_p
                flags["greedy"][:n] = values.greedy
            self.floats.send()
            self.flags.send()
            self._floats_rows = rows[0]

    def rows_params(self, max_top_k: int, any_top_p: bool) -> RowParams:
        """The parameters as the sampler reads them (derived from the buffers: inside a graph, at each replay)."""
        ints, floats = self.ints.view, self.floats.view
        return RowParams(
            floats("temperature"),
            self.flags.view("greedy"),
            ints("top_k"),
            floats("top_p"),
            ints("seeds"),
            ints("counters"),
            max_top_k,
            any_top_p,
        )


@dataclass(frozen=True)
class _LastRows:
    """What the last iteration left: its rows' memories (weakly: nothing here keeps a finished row's memory alive) and the
    numbers the next iteration of the same rows starts from, so that a batch going on is not read back row by
    row (vLLM's persistent batch)."""

    memories: list[weakref.ref[Memory]]
    mem_lens: np.ndarray | int  # [n], or one for every row
    grids: np.ndarray | int  # [n], or one for every row (0: none)
    after: RowArrays

    def alive(self) -> Iterator[Memory | None]:
        return (ref() for ref in self.memories)


def _rules(memories: Sequence[Memory]) -> tuple[np.ndarray | int, np.ndarray | int]:
    """The rows' window rules, for `txl.window.keeps_after` and `windows_at`: (mem_len, grid) as integers when
    every row has the same, else arrays."""
    first = memories[0]
    mem_len, grid = first.mem_len, first.grid
    if all(m.mem_len == mem_len and m.grid == grid for m in memories):
        return mem_len, grid or 0
    n = len(memories)
    return (
        np.fromiter((m.mem_len for m in memories), dtype=np.int64, count=n),
        np.fromiter((m.grid or 0 for m in memories), dtype=np.int64, count=n),
    )


@dataclass
class _Graph:
    """One captured decoding iteration and the buffers it reads and writes. It keeps alive everything its body
    reads that it does not own (the positional tables), so that nothing it captured is ever freed under it."""

    step: StaticDecodeStep
    sampling: SamplingInputs
    hidden_in: Tensor  # [B, D]
    readback: Tensor  # [B, 2] float64 out: each row's token and its log-prob, read by the host in one copy
    hidden_out: Tensor  # [B, D] out
    tables: list[Tensor]  # per layer, the positional keys the body reads
    replay: Callable[[], None]


class DecodeGraphs:
    def __init__(
        self,
        model: TransfoXLLMHeadModel,
        pool: BlockPool,
        path: DecodePath,
        *,
        eager: EagerDecode,
        max_batch_size: int,
        max_positions: int,
    ) -> None:
        """`path`: the kernels the graphs' body takes, and whether they are captured (`graphs` "cuda") or their
        static buffers run eagerly ("static"); `eager`: the eager path, which runs an iteration whose graph was
        turned off while it was planned; `max_positions`: the most positions a memory holds between steps (its
        window rule's `max_positions` at the server's largest mem_len); rows beyond it run eagerly."""
        if path.graphs == "off":
            raise ValueError("a decode path with graphs off gets no graphs")
        self.model = model
        self.pool = pool
        self.path = path
        self.device = pool.layout.device
        self.eager = eager
        self.capture = path.graphs == "cuda"
        self.sizes = buckets(max_batch_size)
        self.vocab = model.config.vocab_size
        # A row attends over at most its memory and its new token: blocks and distances to cover.
        self.max_blocks = resting_blocks(max_positions + 1, pool.block_size) + 1
        self.n_pos = max_positions + 1
        self._scratch = BlockTable(pool, pool.allocate(1), owned=True)
        self._graphs: dict[GraphKey, _Graph] = {}
        self._generation = pool.generation
        self._memory_pool = torch.cuda.graph_pool_handle() if self.capture else None
        # Why the graphs are off, once they are (a failed capture or check): set once, never retried.
        self.off: str | None = None
        # Tokens and log-probs read back through page-locked buffers, two in turn (`_read_back`).
        self.readbacks = ReadBackTurns(self.sizes[-1], pinned=self.capture)
        # The new hidden states of the last iteration: all rows' [n, D], and each row's view of it.
        self._last_hidden: tuple[Tensor, tuple[Tensor, ...]] | None = None
        # The memories the last iteration left, weakly (a finished row's blocks are not kept), with its numbers.
        self._last_rows: _LastRows | None = None

    def all_keys(self) -> list[GraphKey]:
        """Every graph this server uses, largest batch first (captured in that order, smaller graphs reuse the
        memory the larger ones' captures freed, as vLLM does)."""
        return [
            (size, k, top_p)
            for size in reversed(self.sizes)
            for k in top_k_buckets(self.vocab)
            for top_p in (False, True)
        ]

    def key(self, rows: Sequence[DecodeRow]) -> GraphKey | None:
        """The graph these rows run as, or None for a shape outside the captured set."""
        if not rows or len(rows) > self.sizes[-1]:
            return None
        k = top_k_bucket(rows, self.vocab)
        if k is None:
            return None
        size = next(s for s in self.sizes if s >= len(rows))
        return size, k, any(r.params.top_p < 1 for r in rows)

    def supports(self, rows: Sequence[DecodeRow]) -> bool:
        """Whether these rows can run as a graph: the graphs are on, the shape is one captured (on a CPU, one
        that can be built), none asks for top log-probs, each is within the distances and blocks the buffers
        cover (known before planning: a step never changes a row's block count but by the blocks its new
        position needs)."""
        if self.off is not None or any(r.top_logprobs for r in rows):
            return False
        key = self.key(rows)
        if key is None or (self.capture and key not in self._graphs):
            return False
        bs = self.pool.block_size
        return all(
            r.memory.rows[0].length + 1 <= self.n_pos
            and -(-(r.memory.rows[0].end + 1) // bs) <= self.max_blocks
            for r in rows
        )

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Captures (on a CPU: builds) every graph of `all_keys()`; raises on the first failure."""
        for key in self.all_keys():
            if key not in self._graphs:
                self._graphs[key] = self._build(*key)
        if self.capture:
            log.info("captured %d decoding graphs", len(self._graphs))

    @property
    def built(self) -> int:
        """Graphs captured (on a CPU: buffers built) so far."""
        return len(self._graphs)

    def turn_off(self, reason: str) -> None:
        """Decoding runs eagerly from now on; `reason` is logged once and reported."""
        if self.off is None:
            self.off = reason
            log.warning("CUDA graphs are off: %s; decoding runs eagerly", reason)
        self._graphs.clear()

    @torch.inference_mode()
    def poison(self, key: GraphKey) -> None:
        """Fills graph `key`'s outputs with values no replay leaves (NaN, token -1): a replay that does not
        write them is then seen (`engine.selfcheck`)."""
        graph = self._graphs[key]
        graph.readback[:, 0] = -1
        graph.readback[:, 1] = float("nan")
        graph.hidden_out.fill_(float("nan"))

    def run(self, rows: Sequence[DecodeRow]) -> list[DecodeOut]:
        """One decoding iteration of `rows` through their graph, to its sampled tokens."""
        return self.launch(rows).collect()

    @torch.inference_mode()
    def launch(self, rows: Sequence[DecodeRow]) -> Launched:
        """Sends one decoding iteration of `rows` through their graph, without waiting for it: each row's memory
        after it and its new hidden state are known at once (the next iteration can be sent before this one's
        tokens are read: `Launched.collect`). What it asks of the device outside the replay does not grow with
        the rows: the blocks new positions need zeroed in one fill, the rows' inputs sent in three non-blocking
        copies, their hidden states stacked in one launch, the new ones copied in one, the tokens and log-probs
        copied back in one (the iteration's one wait, in `collect`)."""
        key = self.key(rows)
        assert key is not None, "run only rows the graphs support"
        self.readbacks.check_free()  # before anything is planned or replayed
        same_length = self.model.config.same_length
        memories = [r.memory for r in rows]
        paged = [m.rows[0] for m in memories]
        left, self._last_rows = self._last_rows, None  # used up by this plan, even one that fails
        if (
            left is not None
            and len(left.memories) == len(rows)
            and all(map(operator.is_, memories, left.alive()))
        ):
            # The rows the last iteration left, in its order (a batch going on): their numbers as it left them
            mem_lens, grids, after = left.mem_lens, left.grids, left.after
            fed = after.fed
        else:
            mem_lens, grids = _rules(memories)
            fed = np.fromiter((p.fed for p in paged), dtype=np.int64, count=len(rows))
            after = None
        # Planned first: planning may allocate blocks, and a growable pool then reallocates its tensors.
        plan = plan_decode(self.pool, paged, keeps_after(mem_lens, grids, same_length, fed + 1), after)
        try:
            launched = self._replay(key, rows, memories, plan, mem_lens, grids)
        except BaseException:
            plan.release(results=True)  # nothing takes its results
            raise
        # The step's own holds go once it is sent: the device runs it before any later step could reuse a block
        # they free. Its results' holds are the new memories' (given back too where it ran eagerly instead).
        plan.release(results=launched.outputs is not None)
        return launched

    def _replay(
        self,
        key: GraphKey,
        rows: Sequence[DecodeRow],
        memories: list[Memory],
        plan: DecodePlan,
        mem_lens: np.ndarray | int,
        grids: np.ndarray | int,
    ) -> Launched:
        same_length = self.model.config.same_length
        if self.pool.generation != self._generation:  # the pool was reallocated: captured addresses are stale
            self._graphs.clear()
            self._generation = self.pool.generation
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._rebuild(key)
            if (
                graph is None
            ):  # turned off: this iteration runs eagerly (what was planned is given back, unused)
                return Launched.done(self.eager(rows))
        n = len(rows)
        graph.step.load(plan, windows_at(mem_lens, grids, same_length, plan.positions))
        graph.sampling.load([r.params for r in rows], [r.seed for r in rows], [r.counter for r in rows])
        hiddens = [r.last_hidden for r in rows]
        last = self._last_hidden
        if last is not None and len(last[1]) == n and all(map(operator.is_, hiddens, last[1])):
            graph.hidden_in[:n].copy_(last[0])  # the rows the last iteration left, in its order: one copy
        else:
            torch.stack(hiddens, out=graph.hidden_in[:n])
        graph.replay()
        graph.step.plan = None  # the buffers keep no memory alive
        out = graph.hidden_out[:n].clone()  # one copy, a view per row
        hidden = out.unbind(0)
        self._last_hidden = (out, hidden)
        read_back = self._read_back(graph.readback[:n])
        # Each row's memory after the step holds its blocks (the plan's results' holds): the task releases it.
        memories = [m.like((result,), owns=True) for m, result in zip(memories, plan.results, strict=True)]
        self._last_rows = (
            _LastRows(list(map(weakref.ref, memories)), mem_lens, grids, plan.after)
            if plan.after is not None
            else None
        )
        return Launched(memories, hidden, read_back, turns=self.readbacks)

    def _read_back(self, readback: Tensor) -> ReadBack:
        """Starts copying the iteration's tokens and log-probs to the host: on CUDA into one of two page-locked
        buffers (the next iteration's copy may land while this one's is still unread), with an event to wait on.
        The copy and the event are queued on the current stream of the pool's device, whatever device is current
        on this thread: an event recorded on another device's stream would be ready before the copy landed."""
        turn, buffer = self.readbacks.take()  # on a CPU too: the same rule, which tests can see
        if not self.capture:  # a copy even on a CPU: the next replay writes the same buffer
            return ReadBack(readback.to("cpu", copy=True), None, turn)
        host = buffer[: readback.size(0)]
        with torch.cuda.device(self.device):
            host.copy_(readback, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        return ReadBack(host, ready, turn)

    def _rebuild(self, key: GraphKey) -> _Graph | None:
        """A graph missing while serving: on a CPU (the buffers of a pool that grew, or a first use) built now;
        captured graphs are never made while serving (a pool that may grow gets none: engine.selfcheck)."""
        if self.capture:
            self.turn_off("the memory pool was reallocated under the captured graphs")
            return None
        try:
            graph = self._graphs[key] = self._build(*key)
        except Exception as exc:
            self.turn_off(f"building the decoding buffers failed ({exc})")
            return None
        return graph

    def _build(self, size: int, max_top_k: int, any_top_p: bool) -> _Graph:
        device = self.pool.layout.device
        step = StaticDecodeStep(
            self.pool,
            rows=size,
            max_blocks=self.max_blocks,
            n_pos=self.n_pos,
            scratch_block=int(self._scratch.ids[0]),
        )
        sampling = SamplingInputs(size, self.vocab, device)
        dtype, width = self.model.dtype, self.model.config.d_model
        hidden_in = torch.zeros((size, width), dtype=dtype, device=device)
        readback = torch.zeros((size, 2), dtype=torch.float64, device=device)
        hidden_out = torch.zeros((size, width), dtype=dtype, device=device)
        # The tables the body reads, held by the graph: a later eager step that needs a longer table makes new
        # tensors, and these stay valid (and allocated) for as long as the graph is.
        tables = list(self.model.transformer.positional_tables(self.n_pos))

        path = self.path

        def body() -> None:
            log_probs = self.model.log_probs(hidden_in, path)  # [B, V]
            tokens, _ = sample_rows(
                log_probs, sampling.rows_params(max_top_k, any_top_p), readback, path=path
            )
            self.model.transformer.forward_step(tokens, step, tables, out=hidden_out, path=path)  # [B, D]

        replay: Callable[[], None] = body
        if self.capture:
            replay = self._capture(body)
            log.info("captured a decoding graph: %d rows, top_k %d, top_p %s", size, max_top_k, any_top_p)
        return _Graph(step, sampling, hidden_in, readback, hidden_out, tables, replay)

    def _capture(self, body: Callable[[], None]) -> Callable[[], None]:
        device = self.device
        # Under the pool's device: the side stream, the capture and the kernels' launches belong to it, whatever
        # device is current on this thread (cuda:1 served from a thread whose current device is cuda:0).
        with torch.cuda.device(device):
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):  # warm-up off the capture: lazy initialisation, autotuning
                for _ in range(2):
                    body()
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            # thread_local: CUDA work other threads do meanwhile (tier moves, snapshots) does not invalidate it.
            with torch.cuda.graph(graph, pool=self._memory_pool, capture_error_mode="thread_local"):
                body()
        return graph.replay
