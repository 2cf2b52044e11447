"""Where each row of a decoding step puts its new position, in one native call (plan_marks.c's contract).

`txl.paged.decode_plan.plan_decode` decides it with some forty small array operations when this is not available (no C
compiler, `TXL_CPU_KERNELS=0`); each costs a microsecond or more whatever the rows, and with the model's step
just run they cost more (its caches are cold). Both ways give what `plan_row` gives row by row
(tests/model/test_decode_plan.py runs every case both ways).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .build import Kernel, LoadedLibrary, load_kernel

SOURCE = Path(__file__).with_name("plan_marks.c")
_ARGS = [ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 8


class Marks(NamedTuple):
    """Per row: the slot its new position goes to, blocks dropped, the kept positions' offset in their first
    block, positions fed after; the rows starting a fresh block, left to plan_row, dropping blocks (of the
    others), keeping nothing; and each row's keep, capped at the positions it holds after the step."""

    slots: np.ndarray
    drops: np.ndarray
    starts_after: np.ndarray
    fed_after: np.ndarray
    fresh: np.ndarray
    planned: list[int]
    dropping: np.ndarray
    emptied: np.ndarray
    keeps: np.ndarray


class RowEnds(NamedTuple):
    """What planning reads of each row: its first position's offset in its first block, the positions it holds,
    the blocks in its table and the last of them (0: no table), the positions it has been fed."""

    starts: np.ndarray
    lengths: np.ndarray
    widths: np.ndarray
    lasts: np.ndarray
    fed: np.ndarray


class PlanMarks(Kernel):
    def __init__(self, library: LoadedLibrary) -> None:
        super().__init__(library)
        self._function = library.function("txl_plan_marks", _ARGS)

    def __call__(self, block_size: int, rows: RowEnds, filled: np.ndarray, keeps: np.ndarray) -> Marks:
        """`filled` (the pool's marks, under its lock) is advanced for the rows that append in place."""
        if filled.dtype != np.int64 or not filled.flags.c_contiguous:
            raise ValueError("the pool's marks must be one contiguous int64 array")
        n = rows.starts.size
        inputs = [np.ascontiguousarray(a, dtype=np.int64) for a in rows]
        keeps = np.array(keeps, dtype=np.int64)  # a copy: capped in place
        out = np.empty(8 * n + 4, dtype=np.int64)
        self._function(n, block_size, *(a.ctypes.data for a in inputs), filled.ctypes.data, keeps.ctypes.data,
                       out.ctypes.data)  # fmt: skip
        n_fresh, n_planned, n_dropping, n_emptied = out[8 * n :].tolist()
        return Marks(
            out[:n],
            out[n : 2 * n],
            out[2 * n : 3 * n],
            out[3 * n : 4 * n],
            out[4 * n : 4 * n + n_fresh],
            out[5 * n : 5 * n + n_planned].tolist(),
            out[6 * n : 6 * n + n_dropping],
            out[7 * n : 7 * n + n_emptied],
            keeps,
        )


@functools.cache
def cpu_plan_marks() -> PlanMarks | None:
    """The call for this machine, built on first use; None where it cannot be."""
    return load_kernel(SOURCE, PlanMarks)
