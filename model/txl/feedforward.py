"""Position-wise feed-forward block with its residual connection and LayerNorm (post- or pre-norm)."""

from __future__ import annotations

from torch import Tensor, nn

from .kernels.linear import linear


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

    def core(self, x: Tensor) -> Tensor:
        if self.training:
            return self.CoreNet(x)
        inner, outer = self.CoreNet[0], self.CoreNet[3]
        assert isinstance(inner, nn.Linear) and isinstance(outer, nn.Linear)
        return linear(linear(x, inner, relu=True), outer)  # dropout is the identity at inference

    def forward(self, x: Tensor) -> Tensor:
        """x [B, T, D] -> [B, T, D]."""
        if self.pre_lnorm:
            return x + self.core(self.layer_norm(x))
        return self.layer_norm(x + self.core(x))
