"""What a fused decoding step reads of a decoder layer (txl.paged.fused_decode on a CPU, txl.paged.gpu_decode on a
GPU): its tensors and constants by the paper's names, as the layer hands them out (`decode_weights`, txl.model;
how HF names its modules is the layer's business)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from torch import Tensor


class LayerWeights(NamedTuple):
    """A decoder layer's weights for one step; the tensors first, in decode_layer.c's `TxlLayer` order."""

    qkv: Tensor  # [3*H*Dh, D] the attention's query, key and value projection (no bias)
    out: Tensor  # [D, H*Dh] its output projection (no bias)
    inner: Tensor  # [D_inner, D] the feed-forward's first layer
    inner_bias: Tensor  # [D_inner]
    outer: Tensor  # [D, D_inner] the feed-forward's second layer
    outer_bias: Tensor  # [D]
    norm1: Tensor  # [D] the attention's LayerNorm: gain
    norm1_bias: Tensor  # [D] and shift
    norm2: Tensor  # [D] the feed-forward's LayerNorm: gain
    norm2_bias: Tensor  # [D] and shift
    u: Tensor  # [H, Dh] r_w_bias, the content bias
    v: Tensor  # [H, Dh] r_r_bias, the position bias
    eps1: float  # the attention's LayerNorm epsilon
    eps2: float  # the feed-forward's
    scale: float  # 1 / sqrt(Dh)
    pre_lnorm: bool

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(self[:12])


class DecoderLayer(Protocol):
    """A decoder layer as a fused step reads it (txl.model's `RelPartialLearnableDecoderLayer`)."""

    def decode_weights(self) -> LayerWeights: ...
