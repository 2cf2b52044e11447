"""Sinusoid encodings of relative distance (the paper's R, section 3.3) and the attention masks over them."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PositionalEmbedding(nn.Module):
    """R[d] = [sin(d * f), cos(d * f)] for distances d, with f = 1 / 10000^(2k / d_model)."""

    inv_freq: Tensor

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        # Persistent, as in HF's state dict (`transformer.pos_emb.inv_freq`); recomputed, never trusted from a file.
        self.register_buffer("inv_freq", self.frequencies(d_model))

    @staticmethod
    def frequencies(d_model: int) -> Tensor:
        return 1 / (10000 ** (torch.arange(0.0, d_model, 2.0) / d_model))

    def reset_buffers(self) -> None:
        self.inv_freq = self.frequencies(self.d_model).to(self.inv_freq.device)

    def forward(self, distances: Tensor) -> Tensor:
        """distances [N] (float32) -> [N, d_model] float32."""
        angles = torch.outer(distances, self.inv_freq.float())  # [N, d_model/2]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    def for_keys(self, klen: int, clamp_len: int) -> Tensor:
        """R for the distances of keys 0..klen-1 seen from the last query: klen-1, ..., 0 (clamped). [klen, D]."""
        distances = torch.arange(klen - 1, -1, -1.0, device=self.inv_freq.device)
        if clamp_len > 0:
            distances = distances.clamp(max=clamp_len)
        return self(distances)


def attention_mask(
    *, qlen: int, mlen: int, mem_len: int, same_length: bool, device: torch.device
) -> Tensor | None:
    """[qlen, mlen + qlen] bool, True where query i must not see key j; None when nothing is masked.

    Query i sits at position mlen + i. Causal: keys after it are hidden. `same_length` (HF semantics): a query sees
    only keys at distance < mem_len, so every query attends to the same number of positions once memory is full.
    A same_length window of 0 would hide every key (HF then attends uniformly to all keys, future included);
    it is taken as 1 here, the only place this function departs from HF.
    """
    klen = mlen + qlen
    if qlen == 1 and (not same_length or klen <= max(mem_len, 1)):
        return None
    query_pos = torch.arange(mlen, klen, device=device)[:, None]  # [T, 1]
    key_pos = torch.arange(klen, device=device)[None, :]  # [1, K]
    distance = query_pos - key_pos  # [T, K]
    mask = distance < 0
    if same_length:
        mask |= distance >= max(mem_len, 1)
    return mask
