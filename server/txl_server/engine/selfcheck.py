"""Start-up on the device: the decode path chosen and checked, its decoding graphs captured and checked, each
against the plain eager path, before the server says it is ready.

A GPU path that is wrong is worse than a slow one: it answers every request with plausible garbage. So before
the worker starts (and so before `/ready` answers), on dummy rows of random tokens in the server's own pool:

1. each candidate path (`engine.decode_path`: Triton's kernels, then on a CPU the C kernels, whose fused layer
   the check's 4 rows take) decodes a step that its torch variant also decodes, and a scored prompt segment
   follows (on a CPU through the C prefill kernel, which the C path names too); if it raises, or its tokens,
   log-probs or hidden states differ, it is logged once and the next one is tried (the torch path is the
   reference and always stands); the first that matches is handed to the worker (`Worker.decode_with`);
2. every decoding graph the server will use is captured (on a CPU: its static buffers built), on that path, and
   replayed once with its outputs poisoned (NaN, token -1) beforehand, against the eager path. A capture that
   raises, or a replay that differs, turns the graphs off for good, logged once: decoding then runs eagerly.
   Never a failed request, never a capture retried.

What was chosen, and why, is a `CheckedPath` (`engine.decode_path`; logged in one line, and reported with the pool
and the window grid by `engine.device_report`). A device error on the way (a CUDA error that poisons the context:
the device then runs nothing more, `engine.device_failure`) sets the worker's `device_error`, so that `/ready`
fails; an error the device runs on after only turns off the piece that raised it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from txl import BlockPool, TransfoXLLMHeadModel
from txl.kernels import DecodePath
from txl.kernels.cpu.linear_choice import ROW_BUCKETS
from txl.kernels.triton import decode as triton_decode
from txl.kernels.triton import sampling as triton_sampling
from txl.paged import gpu_decode
from txl.sampling import SamplingParams
from txl.window import WindowRule

from .comparison import Comparison, Float32Step, compare_paths, first_line
from .decode_path import CheckedPath, PathSettings, candidates, graphs_setting
from .device_failure import device_works, is_device_error
from .graphs import DecodeGraphs, GraphKey
from .rows import ChunkRow, DecodeOut, DecodeRow
from .runner import ModelRunner
from .worker import Worker

log = logging.getLogger(__name__)

# The top-k of the kernel check's first row (the others: a quarter of it, or none).
KERNEL_CHECK_TOP_K = 64


class DeviceFailed(Exception):
    """A check raised an error of the device, after which the device runs nothing (a sticky CUDA error)."""


def _raise_if_device_failed(worker: Worker, device_error: bool, what: str | None) -> None:
    if device_error and not device_works(worker.pool.layout.device):
        raise DeviceFailed(what)


def prepare(worker: Worker, settings: PathSettings, *, max_mem_len: int, seed: int = 0) -> CheckedPath:
    """Chooses and checks the decode path, hands it to the worker, captures and checks its graphs (before
    `worker.start()`); logs the path in one line. `max_mem_len`: the largest mem_len a session may have."""
    device = worker.pool.layout.device
    offered = candidates(device, settings)
    _, graphs_reason = graphs_setting(settings.cuda_graphs, device)
    checked = CheckedPath(offered.paths[-1], attention_reason=offered.skipped, graphs_reason=graphs_reason)
    try:
        with torch.inference_mode():
            _check(checked, worker, offered.paths, max_mem_len, seed)
    except DeviceFailed as failed:  # nothing further can be trusted: /ready fails
        _device_failed(worker, str(failed))
    except Exception as exc:
        if not is_device_error(exc) or device_works(device):
            raise
        _device_failed(worker, first_line(exc))
    checked.path = worker.runner.path_now
    graphs = worker.runner.graphs
    if graphs is not None and graphs.off is not None:
        checked.graphs_reason = graphs.off
    log.info("%s", checked.line())
    return checked


def _check(
    checked: CheckedPath, worker: Worker, paths: list[DecodePath], max_mem_len: int, seed: int
) -> None:
    if worker.pool.layout.device.type == "cpu":
        _choose_linear_kernels(worker, paths[-1], max_mem_len)
    # Rows enough for the largest graph (a few for the kernels alone).
    graphs = paths[-1].graphs != "off"
    rows = _dummy_rows(worker, max_mem_len, max(4, worker.max_batch_size if graphs else 0), seed)
    try:
        exact = Float32Model(worker.model)
        worker.decode_with(_choose_kernels(checked, worker, paths, rows[:4], exact))
        if worker.runner.graphs is not None:
            _capture_and_check(checked, worker, worker.runner.graphs, rows, exact)
    finally:
        for row in rows:  # the pool holds nothing of the checks once they are done
            row.memory.release()


def _choose_linear_kernels(worker: Worker, path: DecodePath, mem_len: int) -> None:
    """On a CPU each linear layer's kernel is chosen by timing the candidates the first time a shape and row
    count meets it (txl.kernels.cpu.linear; remembered on disk per machine). One forward per measured row count
    now, so that a new machine measures before the server says it is ready, not inside its first users' requests
    (about a second for the bundled model, once). Layer by layer (`path` is the torch path, with the linear
    kernels every candidate has): a step of a few decoding rows takes one native call per layer on the C path
    (txl.paged.fused_decode) instead, but falls back to these kernels wherever that call does not apply."""
    if len(path.linear) < 2:
        return  # one kernel: nothing to measure
    model, pool = worker.model, worker.pool
    started = time.perf_counter()
    for rows in ROW_BUCKETS:
        tokens = torch.zeros(1, rows, dtype=torch.long, device=pool.layout.device)
        _, memory = model(
            tokens, model.empty_memory(1, mem_len=mem_len, pool=pool, grid=worker.grid), path=path
        )
        memory.release()
    log.info("linear kernels for every row count ready in %.2f s", time.perf_counter() - started)


# ---------------------------------------------------------------------------------------------- kernels


def _choose_kernels(
    checked: CheckedPath, worker: Worker, paths: list[DecodePath], rows: list[DecodeRow], exact: Float32Model
) -> DecodePath:
    """The first of `paths` that matches its torch variant (the last, the torch path, always stands). Triton's
    is everything a decoding step runs on the GPU (the fused layers, attention, the log-softmax, sampling), so the
    rows sample as served rows do: greedy, tempered, top-k and top-p together, so that a sampling kernel that
    fails or differs turns Triton off like any other (the torch path then samples too)."""
    for path in paths[:-1]:
        if path.attention == "triton" and worker.pool.layout.device.type == "cuda":
            try:  # every variant serving launches, compiled now: nothing compiles while sessions wait
                _warm_up_triton(worker, path)
            except Exception as exc:
                _raise_if_device_failed(worker, is_device_error(exc), first_line(exc))
                checked.attention_reason = f"the Triton kernels did not compile ({first_line(exc)})"
                log.warning(
                    "%s; decoding does not use them: the torch path takes their parts",
                    checked.attention_reason,
                )
                continue
        check = check_path(worker, path, rows, exact)
        checked.checks.append(check)
        if check.ok:
            return path
        _raise_if_device_failed(worker, check.device_error, check.error)
        checked.attention_reason = check.problem()
        log.warning(
            "%s; decoding does not use those kernels: the torch path takes their parts",
            checked.attention_reason,
        )
    return paths[-1]


def check_path(worker: Worker, path: DecodePath, rows: list[DecodeRow], exact: Float32Model) -> Comparison:
    """`path` against its torch variant on `rows` (a decoding step with every kind of sampling, then a scored
    segment), twice where the first draw gives other tokens at a near tie."""
    what = f"the {path.attention} kernels vs the torch path"
    check = Comparison(what, error="not run")
    for draw in range(2):
        few = [
            _with_params(row, i, (len(rows), KERNEL_CHECK_TOP_K, True), draw) for i, row in enumerate(rows)
        ]
        check = compare_paths(
            what,
            functools.partial(_eager, worker, few, path),
            functools.partial(_eager, worker, few, path.torch_variant()),
            worker.model.dtype,
            exact.step(few),
        )
        if check.ok or check.error is not None or not check.close:
            return check
    return check


def _warm_up_triton(worker: Worker, path: DecodePath) -> None:
    layout, pool = worker.pool.layout, worker.pool
    triton_decode.warm_up(
        layout.device, layout.dtype, heads=layout.n_head, d_head=layout.d_head, block_size=pool.block_size
    )
    gpu_decode.warm_up(worker.model, pool, path)
    triton_sampling.warm_up(layout.device)


def _eager(worker: Worker, rows: list[DecodeRow], path: DecodePath) -> list[DecodeOut]:
    """A decoding step of `rows` on `path`, then a scored prompt segment after the longest one's memory (on a CPU
    the segment takes the C prefill kernel where `path` names it), the segment's outcome put as one more row: its
    summed log-probs and its last hidden state."""
    runner = ModelRunner(worker.model, worker.pool, path)
    vocab = worker.model.config.vocab_size
    tokens = [(7 * i + 3) % vocab for i in range(2 * worker.pool.block_size + 5)]
    segment = ChunkRow(rows[0].memory, tokens, rows[0].last_hidden, score=True)
    decoded = runner.decode(rows)
    (scored,) = runner.run([], [segment])[1]
    assert scored.logprobs is not None
    total = float(scored.logprobs.double().sum())
    return [*decoded, DecodeOut(-1, total, None, scored.memory, scored.last_hidden)]


# ---------------------------------------------------------------------------------------------- graphs


def _capture_and_check(
    checked: CheckedPath, worker: Worker, graphs: DecodeGraphs, rows: list[DecodeRow], exact: Float32Model
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
        checked.checks.append(check)
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
    eager = ModelRunner(worker.model, worker.pool, worker.runner.path)
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
            with torch.inference_mode():
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
    with torch.inference_mode():
        hidden, results = model.transformer.forward_rows(
            tokens, lengths, [empty.rows[0]] * n, [rule] * n, pool
        )  # [N, D]
    last = np.cumsum(lengths) - 1
    params = SamplingParams(temperature=0)
    return [
        DecodeRow(empty.like([result], owns=True), hidden[int(end)].clone(), params, seed=1000 + i, counter=0)
        for i, (result, end) in enumerate(zip(results, last, strict=True))
    ]
