"""Decoding steps on the CPU through a native call of whole layers (`kernels/cpu/decode_layer.c`), where it computes
what the layer-by-layer path would, faster: each weight and each row's memory read once, and none of the layer's
forty-odd small torch operations in between. A step's layers run in one call, which gives up the GIL once.

It takes a step when its decode path names it (`DecodePath.layers == "c"`, txl.kernels.path) and:
- the step is a `PagedStep` whose rows each feed one token (one query group), at most `max_rows()` of them,
  in float32 on the CPU, for inference (no gradients, eval mode);
- the native library builds.

Everything else takes the layer-by-layer path. Both read the same weights (by name: `decode_weights`,
txl.paged.layer_weights), pool and positional tables and write the pool alike; the results agree to float32
rounding.

How many rows: the call's products take each row against a weight row in turn (decoding's case: bound by
reading the weights, until the rows' multiply-adds outgrow the reads, where blocked products such as oneDNN's
win). With more than one torch thread the call runs on torch's own OpenMP team (`kernels/cpu/decode_layer.c`): each
product's output features and the attention's (head, row) items split over it, the same bits on any number of
threads. Hence at most 16 rows (the C linear loop's limit), at most 4 where the call cannot share torch's
team (another OpenMP runtime loaded, or no -fopenmp: the layer-by-layer path, its products on every thread,
catches up beyond), and at most `MAX_WORK` multiply-adds a layer (rows times the layer's weights). The
measurements behind these limits are in docs/model.md (speed on CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..kernels import DecodePath
from ..kernels.cpu.decode_layer import LayerArgs, RowsArgs, StateArgs, cpu_decode_layer, scratch_floats
from .layer_weights import DecoderLayer, LayerWeights
from .pool import BlockPool
from .step import GroupedStep, PagedStep

MAX_ROWS = 16  # the C linear loop's own limit (kernels/cpu/rows_linear.py)
MAX_ROWS_BESIDE_THREADS = 4  # with more torch threads than the call can use (it cannot share their team)
MAX_WORK = 16_000_000  # multiply-adds a layer: rows times the layer's weights


class _FusedLayer:
    """A layer's weights as the native call reads them: the arguments (their addresses, filled once) and the
    tensors they point into, held so that the addresses stay valid."""

    __slots__ = ("addresses", "args", "kept", "size", "weights")

    def __init__(self, weights: LayerWeights) -> None:
        self.weights = weights.tensors
        self.addresses = tuple(t.data_ptr() for t in self.weights)
        self.size = sum(t.numel() for t in self.weights)  # weights read once per row
        self.kept = [
            t.contiguous() for t in self.weights
        ]  # what the call reads (the same tensors, as loaded)
        self.args = LayerArgs(
            *(t.data_ptr() for t in self.kept),
            eps1=weights.eps1,
            eps2=weights.eps2,
            scale=weights.scale,
            pre_lnorm=int(weights.pre_lnorm),
        )

    def current(self, weights: LayerWeights) -> bool:
        """Whether the layer still holds the tensors this was made for, where they were: a replaced weight, or
        one whose data moved (`module.to` swaps a parameter's data in place), needs new addresses; one changed in
        place does not."""
        return all(
            a is b and a.data_ptr() == address
            for a, b, address in zip(weights.tensors, self.weights, self.addresses, strict=True)
        )


def _fused_layer(layer: DecoderLayer) -> _FusedLayer:
    weights = layer.decode_weights()
    found: _FusedLayer | None = vars(layer).get("_fused")
    if found is None or not found.current(weights):
        found = _FusedLayer(weights)
        object.__setattr__(layer, "_fused", found)  # a cache, not a submodule
    return found


def max_rows() -> int:
    """The most rows a step may have to take the native call, for torch's thread count now."""
    kernel = cpu_decode_layer()
    if torch.get_num_threads() == 1 or (kernel is not None and kernel.threaded):
        return MAX_ROWS
    return MAX_ROWS_BESIDE_THREADS


def applies(
    path: DecodePath, layers: Sequence[DecoderLayer], step: GroupedStep, training: bool
) -> list[_FusedLayer] | None:
    """Each layer's native arguments when the native call takes this step on `path` (see the module's
    docstring), else None."""
    if path.layers != "c" or not isinstance(step, PagedStep) or training or torch.is_grad_enabled():
        return None
    if len(step.groups) != 1 or step.groups[0].queries != 1 or step.n_tokens > max_rows():
        return None
    keys = step.pool.keys
    if keys.dtype != torch.float32 or keys.device.type != "cpu" or cpu_decode_layer() is None:
        return None
    fused = [_fused_layer(layer) for layer in layers]
    if step.n_tokens * max(layer.size for layer in fused) > MAX_WORK:
        return None
    return fused


def forward(
    fused: Sequence[_FusedLayer],
    step: PagedStep,
    hidden: Tensor,
    tables: Sequence[Tensor],
    before_layers: Callable[[], None] | None = None,
) -> Tensor:
    """hidden [N, D] (the embedded tokens) -> the last layer's output [N, D]; writes each layer's keys and values
    (and inputs, in a pool that keeps them) to the step's slots, as `forward_paged` does. `before_layers` is
    called right before the first native call (TransfoXLModel.forward_step)."""
    kernel = cpu_decode_layer()
    assert kernel is not None
    pool, group = step.pool, step.groups[0]
    layout = pool.layout
    table = group.table  # [N, S]
    rows = RowsArgs(
        step.n_tokens,
        layout.d_model,
        layout.n_head,
        layout.d_head,
        fused[0].kept[3].numel(),  # the FF's inner width (its first bias)
        table.size(1),
        pool.n_blocks,
        pool.block_size,
        table.data_ptr(),
        group.starts.data_ptr(),
        group.key_lengths.data_ptr(),
        group.windows.data_ptr(),  # [N, 1]
        step.write_blocks.data_ptr(),
        step.write_slots.data_ptr(),
    )
    x = hidden.contiguous()  # [N, D] float32, updated in place by each layer
    threads = kernel.threads()
    scratch = torch.empty(scratch_floats(rows, threads))
    states = _states(pool, tables)
    layers = (LayerArgs * len(fused))(*(layer.args for layer in fused))
    if before_layers is not None:
        before_layers()
    kernel.layers(layers, (StateArgs * len(states))(*states), rows, x.data_ptr(), scratch.data_ptr(), threads)
    return x


def _states(pool: BlockPool, tables: Sequence[Tensor]) -> list[StateArgs]:
    """Each layer's positional table and part of the pool tensors ([layers, ...], contiguous), by address."""
    keys, values, kept = pool.keys, pool.values, pool.hidden
    assert keys.is_contiguous() and values.is_contiguous() and (kept is None or kept.is_contiguous())
    kv_bytes = keys.stride(0) * keys.element_size()
    hidden_bytes = kept.stride(0) * kept.element_size() if kept is not None else 0
    states = []
    for i, positions in enumerate(tables[: keys.size(0)]):
        assert positions.is_contiguous()  # [H, Ptab, Dh]
        states.append(
            StateArgs(
                positions.data_ptr(),
                positions.size(1),
                keys.data_ptr() + i * kv_bytes,
                values.data_ptr() + i * kv_bytes,
                kept.data_ptr() + i * hidden_bytes if kept is not None else None,
            )
        )
    return states
