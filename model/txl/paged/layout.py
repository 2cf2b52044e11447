"""The shapes and placement every memory of one model shares."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MemoryLayout:
    n_layer: int
    n_head: int
    d_head: int
    d_model: int
    dtype: torch.dtype
    device: torch.device

    @property
    def element_size(self) -> int:
        # The dtype's own size: asked per block by the memory tiers' accounting at every commit (making a tensor
        # to ask it took a tenth of the event loop's time on a chained turn).
        return self.dtype.itemsize

    def bytes_per_position(self, keep_hidden: bool = False) -> int:
        """Bytes one remembered position costs, all layers: keys + values (+ hidden states)."""
        width = 2 * self.n_head * self.d_head + (self.d_model if keep_hidden else 0)
        return self.n_layer * width * self.element_size

    def on(
        self, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> MemoryLayout:
        """The same shapes with another dtype or device."""
        return MemoryLayout(
            self.n_layer,
            self.n_head,
            self.d_head,
            self.d_model,
            dtype or self.dtype,
            torch.device(device) if device is not None else self.device,
        )
