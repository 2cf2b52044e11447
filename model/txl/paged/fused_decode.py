"""Decoding steps on the CPU through a native call of a whole layer (`kernels/decode_layer.c`), where it computes
what the layer-by-layer path would, faster: each weight and each row's memory read once, and none of the layer's
forty-odd small torch operations in between. A step's layers run in one call, which gives up the GIL once.

It takes a step when:
- the step is a `PagedStep` whose rows each feed one token (one query group), at most `max_rows()` of them,
  in float32 on the CPU, for inference (no gradients, eval mode);
- decoding attention would take the CPU kernel (not torch's path: `txl.kernels.reference_path()` turns this off
  too), and the native library builds;
- no other linear kernel is asked for (`txl.kernels.linear.prefer("plain")` or `"onednn"` turns it off;
  `"native"`, the kernel the call's products are, keeps it).

Everything else takes the layer-by-layer path (`disabled()` forces it, for tests and benchmarks). Both read the
same weights, pool and positional tables and write the pool alike; the results agree to float32 rounding.

How many rows: the call's products take each row against a weight row in turn (decoding's case: bound by
reading the weights, until the rows' multiply-adds outgrow the reads, where blocked products such as oneDNN's
win). With more than one torch thread the call runs on torch's own OpenMP team (`kernels/decode_layer.c`): each
product's output features and the attention's (head, row) items split over it, the same bits on any number of
threads. Hence at most 16 rows (the native linear loop's limit), at most 4 where the call cannot share torch's
team (another OpenMP runtime loaded, or no -fopenmp: the layer-by-layer path, its products on every thread,
catches up beyond), and at most `MAX_WORK` multiply-adds a layer (rows times the layer's weights). The
measurements behind these limits are in docs/model.md (speed on CPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Protocol, cast

import torch
from torch import Tensor, nn

from ..kernels import decode_kernel
from ..kernels import linear as linear_kernels
from ..kernels.decode_layer import LayerArgs, RowsArgs, StateArgs, cpu_decode_layer, scratch_floats
from ..kernels.paged_decode import PagedDecodeKernel
from ..kernels.scoped import scoped
from .pool import BlockPool
from .step import GroupedStep, PagedStep


class _Attention(Protocol):
    @property
    def layer_norm(self) -> nn.LayerNorm: ...
    @property
    def scale(self) -> float: ...
    @property
    def pre_lnorm(self) -> bool: ...


class _FeedForward(Protocol):
    @property
    def layer_norm(self) -> nn.LayerNorm: ...


class DecoderLayer(Protocol):
    """What the call reads of a decoder layer (txl.model's, HF's module names): the attention `dec_attn` (`qkv_net`,
    `o_net`, `layer_norm`, `r_w_bias`, `r_r_bias`, `scale`, `pre_lnorm`) and the feed-forward `pos_ff` (`CoreNet.0`,
    `CoreNet.3`, `layer_norm`)."""

    @property
    def dec_attn(self) -> _Attention: ...
    @property
    def pos_ff(self) -> _FeedForward: ...


MAX_ROWS = 16  # the native linear loop's own limit (kernels/rows_linear.py)
MAX_ROWS_BESIDE_THREADS = 4  # with more torch threads than the call can use (it cannot share their team)
MAX_WORK = 16_000_000  # multiply-adds a layer: rows times the layer's weights
_enabled: ContextVar[bool] = ContextVar("txl_fused_decode", default=True)


def disabled() -> contextlib.AbstractContextManager[None]:
    """Inside this block, decoding steps take the layer-by-layer path."""
    return scoped(_enabled, False)


class _FusedLayer:
    """A layer's weights as the native call reads them: the arguments (their addresses, filled once) and the
    tensors they point into, held so that the addresses stay valid."""

    __slots__ = ("addresses", "args", "kept", "size", "weights")

    def __init__(self, layer: nn.Module) -> None:
        described = cast(DecoderLayer, layer)
        attn, ff = described.dec_attn, described.pos_ff
        self.weights = _weights(layer)
        self.addresses = tuple(t.data_ptr() for t in self.weights)
        self.size = sum(t.numel() for t in self.weights)  # weights read once per row
        self.kept = [
            t.contiguous() for t in self.weights
        ]  # what the call reads (the same tensors, as loaded)
        self.args = LayerArgs(
            *(t.data_ptr() for t in self.kept),
            eps1=attn.layer_norm.eps,
            eps2=ff.layer_norm.eps,
            scale=attn.scale,
            pre_lnorm=int(attn.pre_lnorm),
        )

    def current(self, layer: nn.Module) -> bool:
        """Whether the layer still holds the tensors this was made for, where they were: a replaced weight, or
        one whose data moved (`module.to` swaps a parameter's data in place), needs new addresses; one changed in
        place does not."""
        return all(
            a is b and a.data_ptr() == address
            for a, b, address in zip(_weights(layer), self.weights, self.addresses, strict=True)
        )


def _weights(layer: nn.Module) -> tuple[Tensor, ...]:
    """In decode_layer.c's TxlLayer order: qkv, o, FF in (weight, bias), FF out (weight, bias), the attention's
    LayerNorm, the FF's LayerNorm, u, v. Read from the modules' own dicts (what attribute access on a module does
    too, at a fraction of its cost: every step checks them)."""
    attn, ff = layer._modules["dec_attn"], layer._modules["pos_ff"]
    assert attn is not None and ff is not None
    core = ff._modules["CoreNet"]
    assert core is not None
    modules = attn._modules
    return tuple(
        module._parameters[name]  # type: ignore[union-attr, misc]
        for module, name in (
            (modules["qkv_net"], "weight"),
            (modules["o_net"], "weight"),
            (core._modules["0"], "weight"),
            (core._modules["0"], "bias"),
            (core._modules["3"], "weight"),
            (core._modules["3"], "bias"),
            (modules["layer_norm"], "weight"),
            (modules["layer_norm"], "bias"),
            (ff._modules["layer_norm"], "weight"),
            (ff._modules["layer_norm"], "bias"),
            (attn, "r_w_bias"),
            (attn, "r_r_bias"),
        )
    )


def _fused_layer(layer: nn.Module) -> _FusedLayer:
    found: _FusedLayer | None = layer.__dict__.get("_fused")
    if found is None or not found.current(layer):
        found = _FusedLayer(layer)
        object.__setattr__(layer, "_fused", found)  # a cache, not a submodule
    return found


def max_rows() -> int:
    """The most rows a step may have to take the native call, for torch's thread count now."""
    kernel = cpu_decode_layer()
    if torch.get_num_threads() == 1 or (kernel is not None and kernel.threaded):
        return MAX_ROWS
    return MAX_ROWS_BESIDE_THREADS


def applies(layers: Sequence[nn.Module], step: GroupedStep, training: bool) -> list[_FusedLayer] | None:
    """Each layer's native arguments when the native call takes this step (see the module's docstring), else None.
    `layers`: `DecoderLayer`s."""
    if not _enabled.get() or not isinstance(step, PagedStep) or training or torch.is_grad_enabled():
        return None
    if len(step.groups) != 1 or step.groups[0].queries != 1 or step.n_tokens > max_rows():
        return None
    keys = step.pool.keys
    if keys.dtype != torch.float32 or keys.device.type != "cpu":
        return None
    if linear_kernels.preferred() not in (None, linear_kernels.NATIVE):
        return None
    if not isinstance(decode_kernel(keys), PagedDecodeKernel) or cpu_decode_layer() is None:
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
