"""Position-wise feed-forward block with its residual connection and LayerNorm (post- or pre-norm)."""

from __future__ import annotations

from typing import cast

from torch import Tensor, nn

from .kernels import REFERENCE, DecodePath
from .kernels.cpu.linear import linear

# HF's names for the feed-forward's two linear layers in `CoreNet` (the ReLU and dropouts between them count).
INNER, OUTER = "0", "3"


class PositionwiseFF(nn.Module):
    def __init__(
        self, d_model: int, d_inner: int, dropout: float, *, pre_lnorm: bool, layer_norm_epsilon: float
    ) -> None:
        super().__init__()
        # Same module names as HF (`pos_ff.CoreNet.0`, `pos_ff.CoreNet.3`) so state dicts load unchanged.
        self.CoreNet = nn.Sequential(
            nn.Linear(d_model, d_inner),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(d_inner, d_model),
            nn.Dropout(dropout),
        )
        self.layer_norm = nn.LayerNorm(d_model, eps=layer_norm_epsilon)
        self.pre_lnorm = pre_lnorm

    @property
    def inner(self) -> nn.Linear:
        """The first linear layer, d_model -> d_inner (a ReLU after it)."""
        return cast(nn.Linear, self.CoreNet[int(INNER)])

    @property
    def outer(self) -> nn.Linear:
        """The second linear layer, d_inner -> d_model."""
        return cast(nn.Linear, self.CoreNet[int(OUTER)])

    def decode_tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(inner weight, inner bias, outer weight, outer bias, LayerNorm gain, LayerNorm shift): what a fused
        decoding step reads (txl.paged.layer_weights). From the modules' registries, by name: what attribute
        access reads, at a small part of its cost (a CPU step asks every layer, to see whether one changed)."""
        layers = self._modules["CoreNet"]._modules  # type: ignore[union-attr]
        inner, outer = layers[INNER]._parameters, layers[OUTER]._parameters  # type: ignore[union-attr]
        norm = self._modules["layer_norm"]._parameters  # type: ignore[union-attr]
        return (  # type: ignore[return-value]
            inner["weight"],
            inner["bias"],
            outer["weight"],
            outer["bias"],
            norm["weight"],
            norm["bias"],
        )

    def core(self, x: Tensor, path: DecodePath = REFERENCE) -> Tensor:
        if self.training:
            return self.CoreNet(x)
        # dropout is the identity at inference
        return linear(linear(x, self.inner, path.linear, relu=True), self.outer, path.linear)

    def forward(self, x: Tensor, path: DecodePath = REFERENCE) -> Tensor:
        """x [B, T, D] -> [B, T, D]; `path`: which kernels its linear layers take (txl.kernels.path)."""
        if self.pre_lnorm:
            return x + self.core(self.layer_norm(x), path)
        return self.layer_norm(x + self.core(x, path))
