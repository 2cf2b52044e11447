"""A whole decoder layer for decoding rows in one native call (`decode_layer.c`), float32 on the CPU.

Why: at one row, a layer's torch path is about forty small operations (projections, bias adds, the positional
product, index copies, LayerNorms), each a Python call and a dispatch, around four weight reads: on a small model
that overhead is a large share of a token's time (docs/model.md). The call here reads each weight once and every row's
memory once, as the native linear and attention kernels do, with nothing in between.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from .build import Kernel, LoadedLibrary, load_kernel

SOURCE = Path(__file__).with_name("decode_layer.c")


def _fields(kind: type, *names: str) -> list[tuple[str, type]]:
    return [(name, kind) for name in names]


ADDRESS, INT64 = ctypes.c_void_p, ctypes.c_int64


class LayerArgs(ctypes.Structure):
    """decode_layer.c's TxlLayer: one layer's weights and constants."""

    _fields_ = [
        *_fields(ADDRESS, "qkv_w", "o_w", "ff1_w", "ff1_b", "ff2_w", "ff2_b"),
        *_fields(ADDRESS, "ln1_w", "ln1_b", "ln2_w", "ln2_b", "u", "v"),
        *_fields(ctypes.c_float, "eps1", "eps2", "scale"),
        ("pre_lnorm", INT64),
    ]


class StateArgs(ctypes.Structure):
    """decode_layer.c's TxlState: a layer's positional table and its part of the pool, for one step."""

    _fields_ = [("pos", ADDRESS), ("ptab", INT64), *_fields(ADDRESS, "keys", "values", "hidden")]


class RowsArgs(ctypes.Structure):
    """decode_layer.c's TxlRows: the step's sizes and each row's block table, window and write slot."""

    _fields_ = [
        *_fields(INT64, "R", "D", "H", "Dh", "Di", "S", "NB", "bs"),
        *_fields(ADDRESS, "table", "starts", "klens", "windows", "write_blocks", "write_slots"),
    ]


def scratch_floats(rows: RowsArgs, threads: int) -> int:
    """Floats of scratch one call on `threads` threads needs (see decode_layer.c)."""
    return rows.R * (4 * rows.H * rows.Dh + rows.D + rows.Di) + threads * rows.S * rows.bs


class DecodeLayerKernel(Kernel):
    def __init__(self, library: LoadedLibrary) -> None:
        super().__init__(library)
        self._function = library.function(
            "txl_decode_layer_f32",
            [
                ctypes.POINTER(LayerArgs),
                ctypes.POINTER(StateArgs),
                ctypes.POINTER(RowsArgs),
                ADDRESS,
                ADDRESS,
                INT64,
            ],
        )
        self._layers = library.function(
            "txl_decode_layers_f32",
            [
                ctypes.POINTER(LayerArgs),
                ctypes.POINTER(StateArgs),
                INT64,
                ctypes.POINTER(RowsArgs),
                ADDRESS,
                ADDRESS,
                INT64,
            ],
        )

    def threads(self) -> int:
        """The threads a call uses now: torch's count where the call shares torch's team, else 1."""
        return self.library.team(torch.get_num_threads())

    def __call__(
        self, layer: LayerArgs, state: StateArgs, rows: RowsArgs, x: int, scratch: int, threads: int
    ) -> None:
        """Runs one layer for `rows` on `threads` threads. x: the address of their inputs [R, D] (float32,
        contiguous), updated in place; scratch: the address of at least `scratch_floats(rows, threads)` floats.
        The caller keeps every tensor the arguments point into alive through the call (the GIL is released during
        it)."""
        self._function(ctypes.byref(layer), ctypes.byref(state), ctypes.byref(rows), x, scratch, threads)

    def layers(
        self,
        layers: ctypes.Array[LayerArgs],
        states: ctypes.Array[StateArgs],
        rows: RowsArgs,
        x: int,
        scratch: int,
        threads: int,
    ) -> None:
        """Runs the step's layers, `layers[i]` with `states[i]`, one after the other in one call (the GIL released
        once for them all: a layer's call each would take it back between layers); as many calls of one layer."""
        n = len(layers)
        assert len(states) == n
        self._layers(layers, states, n, ctypes.byref(rows), x, scratch, threads)


@functools.cache
def cpu_decode_layer() -> DecodeLayerKernel | None:
    """The kernel for this machine, built on first use; None where it cannot be (no compiler, a failed build,
    `TXL_CPU_KERNELS=0`)."""
    return load_kernel(SOURCE, DecodeLayerKernel, openmp=True)
