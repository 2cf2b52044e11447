"""What one decoding iteration through the graphs asks of a device, counted on the CPU: the model, the pool and
the buffers live on the `meta` device (shapes, no data: the host's view of a GPU) and a dispatch mode counts, per
phase (before the replay, the replayed body, after it), the operations that would launch a kernel, copy between
host and device, or make the host wait for the device (an item, a nonzero, a copy to the host, a host-to-device
copy without non_blocking, which CUDA follows with a stream synchronisation)."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import txl
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from txl.kernels import DecodePath
from txl.sampling import SamplingParams
from txl_server.engine import graphs as graphs_module
from txl_server.engine.rows import DecodeRow
from txl_server.engine.runner import ModelRunner

from tests.helpers.tiny_models import tiny_model

# The decoding iteration's paths, through the graphs' static buffers (on the meta device: nothing is captured).
TORCH = DecodePath(graphs="static")
TRITON = DecodePath.triton(
    graphs="static"
)  # each Triton launch one operation (txl.kernels.triton.common.launch)
SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "unique_dim", "_unique2"}
PHASES = ("before", "body", "after")
# Operations that only allocate: no kernel runs (torch.zeros is an allocation and a fill: the fill counts).
ALLOCATING = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}


class Counts(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.phase = "setup"
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[1]
        count = self.counts[self.phase]
        if name in SYNCING:
            count["sync"] += 1
        if name in ("_to_copy", "to", "copy_"):
            source = args[1] if name == "copy_" else args[0]
            if name == "copy_":
                target = args[0].device.type
                non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            else:
                device = kwargs.get("device")
                target = device.type if device is not None else source.device.type
                non_blocking = kwargs.get("non_blocking", False)
            if source.device.type == "cpu" and target == "meta":
                count["h2d"] += 1
                if not non_blocking:
                    count["sync"] += 1  # a blocking host-to-device copy waits for the stream
            elif source.device.type == "meta" and target == "cpu":
                count["d2h"] += 1
                count["sync"] += 1
                if name != "copy_":
                    return torch.zeros(source.shape, dtype=kwargs.get("dtype") or source.dtype)
        out = func(*args, **kwargs)
        made = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.device.type == "meta"]
        kernel = name not in ("_to_copy", "to") or _same_device_cast(args, kwargs)
        if (
            made
            and kernel
            and not func.is_view
            and name not in ALLOCATING
            and not _returns_an_input(made, args, name)
        ):
            count["launch"] += 1
        return out


def _returns_an_input(made: list[torch.Tensor], args: tuple, name: str) -> bool:
    """An operation that hands back an input unchanged (dropout at inference): no kernel runs. (In-place
    operations, `add_`, also return their input, and do run one.)"""
    if name.endswith("_"):
        return False
    inputs = {id(t) for t in tree_leaves(args) if isinstance(t, torch.Tensor)}
    return all(id(t) in inputs for t in made)


def _same_device_cast(args: tuple, kwargs: dict) -> bool:
    """A conversion on the device itself (a dtype cast): a kernel, where a copy across devices is a transfer."""
    source = args[0]
    device = kwargs.get("device")
    return device is None or torch.device(device).type == source.device.type


_tensor = torch.tensor


@contextmanager
def counting() -> Iterator[Counts]:
    """A dispatch mode counting by phase; `torch.tensor(list, device=...)` (which copies below the dispatcher)
    is counted as a blocking host-to-device copy."""
    counts = Counts()

    def tensor(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None and torch.device(device).type != "cpu":
            counts.counts[counts.phase]["h2d"] += 1
            counts.counts[counts.phase]["sync"] += 1
        return _tensor(*args, **kwargs)

    torch.tensor = tensor
    try:
        with counts:
            yield counts
    finally:
        torch.tensor = _tensor


def one_iteration(batch: int) -> dict[str, collections.Counter[str]]:
    """Counts of a warm decoding iteration of `batch` rows (mixed sampling, some rows crossing into a new block)
    through `DecodeGraphs.run`."""
    model = tiny_model(seed=1, mem_len=32).to("meta")
    model.transformer.pos_emb.inv_freq = torch.empty_like(model.transformer.pos_emb.inv_freq)
    pool = txl.BlockPool(model.memory_layout(), block_size=16, blocks=4096, growable=False)
    params = [
        SamplingParams(temperature=0.8, top_p=0.95, seed=i) if i % 2 else SamplingParams(top_k=40)
        for i in range(batch)
    ]
    rows = _rows(model, pool, params, [15 + i % 3 for i in range(batch)], mem_len=32, grid=8)
    return _iteration(model, pool, rows, max_positions=40, path=TORCH)


def wt103_model(n_layer: int = 18) -> txl.TransfoXLLMHeadModel:
    """The wt103 shape (18 layers, d_model 1,024, 16 heads, vocabulary 267,735 in 4 clusters) in bfloat16, on the
    meta device."""
    config = txl.TxlConfig(dropout=0.0, n_layer=n_layer)
    with torch.device("meta"):
        model = txl.TransfoXLLMHeadModel(config).to(torch.bfloat16).eval()
    model.transformer.pos_emb.inv_freq = torch.empty_like(model.transformer.pos_emb.inv_freq)
    return model


def wt103_iteration(
    batch: int, params: SamplingParams, path: DecodePath, *, n_layer: int = 18
) -> dict[str, collections.Counter[str]]:
    """Counts of a warm decoding iteration of the wt103 shape at its mem_len (1,600), `batch` rows sampled with
    `params`, through `DecodeGraphs.run` on `path` (TRITON: the fused decoding body, the Triton kernels standing in
    as one operation each, `txl.kernels.triton.common.launch`)."""
    model = wt103_model(n_layer)
    mem_len = model.config.mem_len
    pool = txl.BlockPool(model.memory_layout(), block_size=16, blocks=batch * 8 + 8, growable=False)
    rows = _rows(model, pool, [params] * batch, [20] * batch, mem_len=mem_len, grid=None)
    rule = txl.WindowRule(mem_len, model.config.same_length, None)
    return _iteration(model, pool, rows, max_positions=rule.max_positions, path=path)


def _rows(model, pool, params, lengths, *, mem_len, grid) -> list[DecodeRow]:
    rows = []
    with torch.inference_mode():
        for i, (p, n) in enumerate(zip(params, lengths, strict=True)):
            memory = model.empty_memory(1, mem_len=mem_len, pool=pool, grid=grid)
            hidden, memory = model(torch.zeros(1, n, dtype=torch.long, device="meta"), memory)
            rows.append(DecodeRow(memory, hidden[0, -1].clone(), p, i, 0))
    return rows


def _iteration(
    model, pool, rows, *, max_positions: int, path: DecodePath
) -> dict[str, collections.Counter[str]]:
    eager = ModelRunner(model, pool, path).decode
    graphs = graphs_module.DecodeGraphs(
        model, pool, path, eager=eager, max_batch_size=len(rows), max_positions=max_positions
    )
    with torch.inference_mode(), counting() as counts:
        warm = graphs.run(rows)  # built in the setup phase (on a GPU: captured at start-up)
        rows = [
            DecodeRow(o.memory, o.last_hidden, r.params, r.seed, 1) for o, r in zip(warm, rows, strict=True)
        ]
        (graph,) = graphs._graphs.values()
        inner = graph.replay

        def replay() -> None:
            counts.phase = "body"
            inner()
            counts.phase = "after"

        graph.replay = replay
        counts.phase = "before"
        graphs.run(rows)
    return {phase: counts.counts[phase] for phase in PHASES}
