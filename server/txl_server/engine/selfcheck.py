"""Start-up on the device: the decoding attention kernel and the decoding graphs, each checked against the plain
eager path before the server says it is ready.

A GPU path that is wrong is worse than a slow one: it answers every request with plausible garbage. So before
the worker starts (and so before `/ready` answers), on dummy rows of random tokens in the server's own pool:

1. the native decoding kernel (Triton on CUDA; on a CPU the C kernel, and for a few rows the whole layer in
   one native call, `txl.paged.fused_decode`, which the check's 4 rows take) decodes a step that the torch path also
   decodes, and a scored prompt segment follows (on a CPU through the native prefill kernel, which the same
   choice turns on); if it raises, or its tokens, log-probs or hidden states differ, it is logged once and the
   next one is tried (the torch path is the reference and always stands);
2. every decoding graph the server will use is captured (on a CPU: its static buffers built), with the kernel
   chosen in 1, and replayed once with its outputs poisoned (NaN, token -1) beforehand, against the eager path.
   A capture that raises, or a replay that differs, turns the graphs off for good, logged once: decoding then
   runs eagerly. Never a failed request, never a capture retried.

What was chosen, and why, is a `ServingPath` (reported with the pool and the window grid by
`engine.device_report`). A device error on the way (a CUDA error that
poisons the context: the device then runs nothing more, `engine.device_failure`) sets the worker's `device_error`,
so that `/ready` fails; an error the device runs on after only turns off the piece that raised it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from txl import BlockPool, TransfoXLLMHeadModel
from txl.kernels import decode_kernel, prefer, reference_path, triton_decode, triton_sampling
from txl.kernels.linear_choice import ROW_BUCKETS
from txl.paged import fused_decode, gpu_decode
from txl.sampling import SamplingParams
from txl.window import WindowRule

from .comparison import Comparison, Float32Step, compare_paths, first_line
from .device_failure import device_works, is_device_error
from .graphs import DecodeGraphs, GraphKey
from .rows import ChunkRow, DecodeOut, DecodeRow
from .runner import ModelRunner
from .worker import Worker

log = logging.getLogger(__name__)

# Native decoding kernels in the order they are preferred (txl.kernels names), and the names reported.
NATIVE_KERNELS = ("triton", "cpu")
REPORTED = {"triton": "triton", "cpu": "c", "torch": "torch"}
# The top-k of the kernel check's first row (the others: a quarter of it, or none).
KERNEL_CHECK_TOP_K = 64


@dataclass
class ServingPath:
    """What decoding runs on, chosen at start-up, and why it is not faster where it is not."""

    attention: str  # "triton" | "c" | "torch"
    attention_reason: str | None = None  # why not a native kernel before it
    graphs_reason: str | None = None  # why there are no graphs (unset: see the graphs' own `off`)
    checks: list[Comparison] = field(default_factory=list)  # everything compared at start-up

    @property
    def failures(self) -> list[Comparison]:
        return [c for c in self.checks if not c.ok]


def graphs_setting(cuda_graphs: bool | None, device: torch.device) -> tuple[bool, str | None]:
    """Whether the worker gets decoding graphs (TXL_CUDA_GRAPHS; default: on CUDA), and why not."""
    if cuda_graphs is None:
        wanted = device.type == "cuda"
        return wanted, None if wanted else f"not a CUDA device ({device.type})"
    return cuda_graphs, None if cuda_graphs else "switched off (TXL_CUDA_GRAPHS=0)"


class DeviceFailed(Exception):
    """A check raised an error of the device, after which the device runs nothing (a sticky CUDA error)."""


def _raise_if_device_failed(worker: Worker, device_error: bool, what: str | None) -> None:
    if device_error and not device_works(worker.pool.layout.device):
        raise DeviceFailed(what)


def prepare(
    worker: Worker,
    *,
    max_mem_len: int,
    triton: bool = True,
    graphs_reason: str | None = None,
    seed: int = 0,
) -> ServingPath:
    """Chooses and checks the attention kernel, captures and checks the graphs (before `worker.start()`).
    `max_mem_len`: the largest mem_len a session may have; `triton`: TXL_TRITON_KERNELS; `graphs_reason`: why
    the worker has no graphs (`graphs_setting`)."""
    path = ServingPath("torch", graphs_reason=graphs_reason)
    try:
        with torch.inference_mode():
            _check(path, worker, max_mem_len, triton, seed)
    except DeviceFailed as failed:  # nothing further can be trusted: /ready fails
        _device_failed(worker, str(failed))
    except Exception as exc:
        if not is_device_error(exc) or device_works(worker.pool.layout.device):
            raise
        _device_failed(worker, first_line(exc))
    return path


def _check(path: ServingPath, worker: Worker, max_mem_len: int, triton: bool, seed: int) -> None:
    graphs = worker.runner.graphs
    if worker.pool.layout.device.type == "cpu":
        _choose_linear_kernels(worker, max_mem_len)
    # Rows enough for the largest graph (a few for the kernel alone).
    rows = _dummy_rows(worker, max_mem_len, max(4, graphs.sizes[-1] if graphs is not None else 0), seed)
    exact = Float32Model(worker.model)
    _choose_attention(path, worker, rows[:4], exact, triton=triton)
    worker.attention = _kernel_of(path.attention)
    if graphs is not None:
        with prefer(worker.attention):
            _capture_and_check(path, worker, graphs, rows, exact)


def _choose_linear_kernels(worker: Worker, mem_len: int) -> None:
    """On a CPU each linear layer's kernel is chosen by timing the candidates the first time a shape and row
    count meets it (txl.kernels.linear; remembered on disk per machine). One forward per measured row count now, so
    that a new machine measures before the server says it is ready, not inside its first users' requests
    (about a second for the bundled model, once). Layer by layer: a step of a few decoding rows takes one native
    call per layer (txl.paged.fused_decode) instead, but falls back to these kernels wherever that call does not
    apply (e.g. the C attention kernel failed its check)."""
    model, pool = worker.model, worker.pool
    started = time.perf_counter()
    for rows in ROW_BUCKETS:
        tokens = torch.zeros(1, rows, dtype=torch.long, device=pool.layout.device)
        with fused_decode.disabled():
            model(tokens, model.empty_memory(1, mem_len=mem_len, pool=pool, grid=worker.grid))
    log.info("linear kernels for every row count ready in %.2f s", time.perf_counter() - started)


# ---------------------------------------------------------------------------------------------- attention


def _kernel_of(reported: str) -> str:
    return next(name for name, shown in REPORTED.items() if shown == reported)


def _available(name: str, pool: BlockPool) -> bool:
    with prefer(name):
        return decode_kernel(pool.keys[0]) is not None


def _choose_attention(
    path: ServingPath, worker: Worker, rows: list[DecodeRow], exact: Float32Model, *, triton: bool
) -> None:
    """The first native kernel that matches the torch path. "triton" is everything a decoding step runs on the
    GPU (the fused layers, attention, the log-softmax, sampling: `txl.kernels.triton_chosen`), so the rows sample
    as served rows do: greedy, tempered, top-k and top-p together, so that a sampling kernel that fails or differs
    turns Triton off like any other (the torch path then samples too)."""
    pool = worker.pool
    for name in NATIVE_KERNELS:
        if not _available(name, pool):
            continue
        if name == "triton" and not triton:
            path.attention_reason = "the Triton kernel is switched off (TXL_TRITON_KERNELS=0)"
            continue
        if name == "triton" and pool.layout.device.type == "cuda":
            try:  # every variant serving launches, compiled now: nothing compiles while sessions wait
                _warm_up_triton(worker)
            except Exception as exc:
                _raise_if_device_failed(worker, is_device_error(exc), first_line(exc))
                path.attention_reason = f"the Triton kernels did not compile ({first_line(exc)})"
                log.warning(
                    "%s; decoding does not use them (attention, layers, sampling: the torch path takes them)",
                    path.attention_reason,
                )
                continue
        check = check_kernel(worker, name, rows, exact)
        path.checks.append(check)
        if check.ok:
            path.attention = REPORTED[name]
            return
        _raise_if_device_failed(worker, check.device_error, check.error)
        path.attention_reason = check.problem()
        log.warning(
            "%s; decoding does not use that kernel (attention, layers, sampling: the torch path takes them)",
            path.attention_reason,
        )


def check_kernel(worker: Worker, name: str, rows: list[DecodeRow], exact: Float32Model) -> Comparison:
    """Kernel `name` against the torch path on `rows` (a decoding step with every kind of sampling, then a
    scored segment), twice where the first draw gives other tokens at a near tie."""
    what = f"the {REPORTED[name]} attention kernel vs the torch path"
    check = Comparison(what, error="not run")
    for draw in range(2):
        few = [
            _with_params(row, i, (len(rows), KERNEL_CHECK_TOP_K, True), draw) for i, row in enumerate(rows)
        ]
        check = compare_paths(
            what,
            functools.partial(_eager, worker, few, name),
            functools.partial(_eager, worker, few, "torch"),
            worker.model.dtype,
            exact.step(few),
        )
        if check.ok or check.error is not None or not check.close:
            return check
    return check


def _warm_up_triton(worker: Worker) -> None:
    layout, pool = worker.pool.layout, worker.pool
    with prefer("triton"):
        triton_decode.warm_up(
            layout.device, layout.dtype, heads=layout.n_head, d_head=layout.d_head, block_size=pool.block_size
        )
        gpu_decode.warm_up(worker.model, pool)
        triton_sampling.warm_up(layout.device)


def _eager(worker: Worker, rows: list[DecodeRow], kernel: str) -> list[DecodeOut]:
    """A decoding step of `rows`, then a scored prompt segment after the longest one's memory (on a CPU the
    segment takes the native prefill kernel, txl.kernels.prefill_attention, which `kernel` "cpu" covers as well), the
    segment's outcome put as one more row: its summed log-probs and its last hidden state."""
    runner = ModelRunner(worker.model, worker.pool)
    vocab = worker.model.config.vocab_size
    tokens = [(7 * i + 3) % vocab for i in range(2 * worker.pool.block_size + 5)]
    segment = ChunkRow(rows[0].memory, tokens, rows[0].last_hidden, score=True)
    with prefer(kernel):
        decoded = runner.decode(rows)
        (scored,) = runner.run([], [segment])[1]
    assert scored.logprobs is not None
    total = float(scored.logprobs.double().sum())
    return [*decoded, DecodeOut(-1, total, None, scored.memory, scored.last_hidden)]


# ---------------------------------------------------------------------------------------------- graphs


def _capture_and_check(
    path: ServingPath, worker: Worker, graphs: DecodeGraphs, rows: list[DecodeRow], exact: Float32Model
) -> None:
    if graphs.capture and worker.pool.growable:
        graphs.turn_off(
            "the memory pool may grow (TXL_FIXED_POOL=0), and a captured graph must never see it move"
        )
        return
    try:
        graphs.capture_all()
    except Exception as exc:
        _raise_if_device_failed(worker, is_device_error(exc), first_line(exc))
        graphs.turn_off(f"capturing them failed ({first_line(exc)})")
        return
    for key in graphs.all_keys():
        check = check_graph(graphs, worker, key, rows, exact)
        path.checks.append(check)
        if not check.ok:
            _raise_if_device_failed(worker, check.device_error, check.error)
            graphs.turn_off(f"at start-up, {check.problem()}")
            return


def check_graph(
    graphs: DecodeGraphs,
    worker: Worker,
    key: GraphKey,
    rows: list[DecodeRow],
    exact: Float32Model | None = None,
) -> Comparison:
    """Graph `key` replayed once on dummy rows, its outputs poisoned before, against the eager path."""
    size, top_k, top_p = key
    smaller = max((s for s in graphs.sizes if s < size), default=0)
    count = size - 1 if size - 1 > smaller else size  # with a padding row, as most iterations have, if it can
    what = (
        f"the graph of {size} row{'s' if size > 1 else ''}"
        + (f", top-k {top_k}" if top_k else "")
        + (", top-p" if top_p else "")
    )
    eager = ModelRunner(worker.model, worker.pool)
    check = Comparison(what, error="not run")
    for draw in range(2):  # a second draw: tokens that differ once at a near tie are not a fault
        batch = [_with_params(row, i, key, draw) for i, row in enumerate(rows[:count])]
        assert graphs.key(batch) == key and graphs.supports(batch)
        check = compare_paths(
            what,
            functools.partial(_replayed, graphs, key, batch),
            functools.partial(eager.decode, batch),
            worker.model.dtype,
            exact.step(batch) if exact is not None else None,
        )
        if check.ok or check.error is not None or not check.close:
            return check
    return check


def _replayed(graphs: DecodeGraphs, key: GraphKey, batch: list[DecodeRow]) -> list[DecodeOut]:
    graphs.poison(key)
    return graphs.run(batch)


def _with_params(row: DecodeRow, i: int, key: GraphKey, draw: int) -> DecodeRow:
    """Row i of a graph's check: sampling that selects graph `key` (its top-k bucket, top-p or not), some rows
    greedy, some sampled."""
    _, top_k, top_p = key
    params = SamplingParams(
        temperature=0.0 if i % 3 == 2 else 0.7 + 0.1 * (i % 4),
        top_k=top_k if i == 0 else (max(1, top_k // 4) if top_k and i % 2 else 0),
        top_p=0.9 if top_p and i % 2 == 0 else 1.0,
    )
    return dataclasses.replace(row, params=params, seed=1000 + i, counter=draw)


def _device_failed(worker: Worker, error: str) -> None:
    if worker.device_error is None:
        worker.device_error = error
    log.error("the device failed at start-up (%s): reporting not ready", worker.device_error)


# ---------------------------------------------------------------------------------------------- float32


class Float32Model:
    """The served model in float32 on the CPU, made on first use and only in half precision: what a path's
    hidden states are judged against when they differ from the eager path's by more than the tolerance
    (`engine.comparison`). Built from the served weights (a copy on the host, never on the device, whose memory
    the pool holds)."""

    def __init__(self, model: TransfoXLLMHeadModel) -> None:
        self.served = model
        self._model: TransfoXLLMHeadModel | None = None

    def model(self) -> TransfoXLLMHeadModel:
        if self._model is None:
            # Ordinary tensors even when made under inference mode (as the checks run): the model's positional
            # table is keyed on its weights' versions, which inference tensors do not keep.
            with torch.inference_mode(False):
                with torch.device("meta"):
                    copy = TransfoXLLMHeadModel(self.served.config)
                copy = copy.to_empty(device="cpu")
                weights = {
                    k: v.detach().to("cpu", torch.float32) for k, v in self.served.state_dict().items()
                }
                copy.load_state_dict(weights)
            self._model = copy.eval()
        return self._model

    def step(self, rows: list[DecodeRow]) -> Float32Step:
        """The rows' decoding step in float32, feeding the tokens the eager path fed."""

        def hidden(outputs: Sequence[DecodeOut]) -> list[Tensor]:
            model = self.model()
            block_size = rows[0].memory.pool.block_size
            blocks = sum(r.memory.rows[0].ids.size for r in rows) + 2 * len(rows) + 2
            pool = BlockPool(model.memory_layout(), block_size=block_size, blocks=blocks)
            memories = [r.memory.to_pool(pool) for r in rows]
            tokens = torch.tensor([o.token for o in outputs[: len(rows)]])
            same_length = model.config.same_length
            with torch.inference_mode(), reference_path():
                out, _ = model.transformer.forward_rows(
                    tokens, [1] * len(rows), [m.rows[0] for m in memories], [m.rule(same_length) for m in memories],
                    pool,
                )  # fmt: skip
            return list(out)

        return hidden


# ---------------------------------------------------------------------------------------------- dummy rows


def _dummy_rows(worker: Worker, mem_len: int, n: int, seed: int) -> list[DecodeRow]:
    """`n` decoding rows in `pool` from random tokens, on the server's window grid at its largest mem_len: the
    first as long as a memory gets (the whole positional table, every block of the buffers), the others short
    and of varied lengths (partly filled blocks, block boundaries). Fed in one forward, on the torch path (the
    kernels are not checked yet)."""
    model, pool = worker.model, worker.pool
    rule = WindowRule(mem_len, model.config.same_length, worker.grid)
    longest = max(1, worker.max_positions)
    while rule.keep(longest) < worker.max_positions:  # fed so that it keeps the most it can
        longest += 1
    span = max(1, min(worker.max_positions, 3 * pool.block_size + 5))
    lengths = [longest] + [1 + (i * 37 + 11) % span for i in range(1, n)]
    generator = torch.Generator().manual_seed(seed)
    device = pool.layout.device
    tokens = torch.randint(0, model.config.vocab_size, (sum(lengths),), generator=generator).to(device)
    empty = model.empty_memory(1, mem_len=mem_len, pool=pool, grid=worker.grid)
    with torch.inference_mode(), reference_path():
        hidden, results = model.transformer.forward_rows(
            tokens, lengths, [empty.rows[0]] * n, [rule] * n, pool
        )  # [N, D]
    last = np.cumsum(lengths) - 1
    params = SamplingParams(temperature=0)
    return [
        DecodeRow(empty.like([result]), hidden[int(end)].clone(), params, seed=1000 + i, counter=0)
        for i, (result, end) in enumerate(zip(results, last, strict=True))
    ]
