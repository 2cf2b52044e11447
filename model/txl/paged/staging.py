"""Getting a step's small inputs from the host to the device without making either wait.

A decoding step on a GPU needs a few hundred integers from the host (block tables, write positions, sampling
parameters). Sent one tensor at a time, from pageable memory, each copy makes the host wait for the device (CUDA
synchronises the stream before a copy from pageable memory) and each is a launch. Here the fields of one dtype
live in one flat device buffer, each field a contiguous view of it (what kernels and a captured graph read), and
the host writes them into one of two page-locked host buffers and sends the whole buffer in one non-blocking copy.
Two host buffers, used in turn: the host may write step N+1's inputs while step N's copy is still queued.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


class StagedInputs:
    def __init__(self, fields: dict[str, tuple[int, ...]], dtype: torch.dtype, device: torch.device) -> None:
        self.shapes = dict(fields)
        self._spans: dict[str, tuple[int, int]] = {}
        at = 0
        for name, shape in fields.items():
            size = math.prod(shape)
            self._spans[name] = (at, at + size)
            at += size
        self.device_buffer = torch.zeros(at, dtype=dtype, device=device)
        pinned = device.type == "cuda"
        self._host = [torch.zeros(at, dtype=dtype, pin_memory=pinned) for _ in range(2)]
        # Each host buffer's fields as numpy views, made once (a step fills them every iteration).
        self._fields = [
            {name: buffer.numpy()[lo:hi].reshape(self.shapes[name]) for name, (lo, hi) in self._spans.items()}
            for buffer in self._host
        ]
        self._turn = 0

    def view(self, name: str) -> Tensor:
        """Field `name` on the device: a contiguous view that keeps its address for the buffer's life."""
        lo, hi = self._spans[name]
        return self.device_buffer[lo:hi].view(self.shapes[name])

    @property
    def turn(self) -> int:
        """Which of the two host buffers `host()` gives now."""
        return self._turn

    def host(self) -> dict[str, np.ndarray]:
        """The host buffer to fill now, as numpy views by field (it still holds what was last written to it)."""
        return self._fields[self._turn]

    def send(self) -> None:
        """Queues the copy of the host buffer just filled; the next `host()` is the other buffer."""
        self.device_buffer.copy_(self._host[self._turn], non_blocking=True)
        self._turn ^= 1


class StagedIds:
    """A variable number of int64 ids for the device (blocks to zero), through a page-locked host buffer that
    grows as needed, two in turn."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned = device.type == "cuda"
        self._host: list[Tensor | None] = [None, None]
        self._turn = 0

    def send(self, ids: np.ndarray) -> Tensor:
        if not self._pinned:  # a CPU (nothing to overlap), or a device seen from the host in tests (meta)
            host = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64))
            if self.device.type == "cpu":
                return host
            return host.to(self.device, non_blocking=True)
        buffer = self._host[self._turn]
        if buffer is None or buffer.numel() < ids.size:
            buffer = self._host[self._turn] = torch.empty(
                max(ids.size, 256) * 2, dtype=torch.int64, pin_memory=True
            )
        host = buffer[: ids.size]
        host.numpy()[:] = ids
        self._turn ^= 1
        return host.to(self.device, non_blocking=True)
