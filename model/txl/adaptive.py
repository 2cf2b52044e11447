"""Adaptive input embeddings and the projected adaptive log-softmax (Baevski & Auli 2019; Grave et al. 2017).

The vocabulary is split at `cutoffs` into a head cluster (the most frequent words) and tail clusters. Cluster i
embeds into d_embed // div_val**i dimensions and is projected to d_model. The output distribution is
p(w) = p_head(w) for head words and p_head(cluster of w) * p_cluster(w) for tail words; the head softmax has one
extra logit per tail cluster, tail cluster i at index cutoffs[0] + i - 1 (HF/TF order).

Log-probabilities are always computed in float32: in float16, HF's version overflows here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from .config import TxlConfig
from .kernels import REFERENCE, DecodePath
from .kernels.cpu.linear import packed_linear
from .kernels.triton import embedding as triton_embedding
from .kernels.triton import softmax as triton_softmax


class AdaptiveEmbedding(nn.Module):
    def __init__(self, config: TxlConfig) -> None:
        super().__init__()
        self.n_token, self.d_embed, self.d_proj = config.vocab_size, config.d_embed, config.d_model
        self.div_val = config.div_val
        self.cutoff_ends = config.cutoff_ends
        self.emb_scale = self.d_proj**0.5
        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ParameterList()
        if self.div_val == 1:
            self.emb_layers.append(nn.Embedding(self.n_token, self.d_embed))
            if self.d_proj != self.d_embed:
                self.emb_projs.append(nn.Parameter(torch.zeros(self.d_proj, self.d_embed)))
        else:
            for i in range(len(self.cutoff_ends) - 1):
                size = self.cutoff_ends[i + 1] - self.cutoff_ends[i]
                dim = config.cluster_dim(i)
                self.emb_layers.append(nn.Embedding(size, dim))
                self.emb_projs.append(nn.Parameter(torch.zeros(self.d_proj, dim)))

    def forward(self, tokens: Tensor, path: DecodePath = REFERENCE) -> Tensor:
        """tokens [...] -> [..., d_model], scaled by sqrt(d_model); through one Triton kernel where `path` says so
        (txl.kernels.path)."""
        triton = path.embedding == "triton"
        if self.div_val == 1:
            embed = self.emb_layers[0](tokens)
            if self.d_proj != self.d_embed:
                embed = nn.functional.linear(embed, self.emb_projs[0])
        elif tokens.device.type == "cpu" and not triton:
            embed = self._by_cluster(tokens.reshape(-1)).view(*tokens.shape, self.d_proj)
        else:
            if triton and not torch.is_grad_enabled():
                scaled = triton_embedding.adaptive_embedding(
                    tokens.reshape(-1),
                    [cast(nn.Embedding, layer).weight for layer in self.emb_layers],
                    list(self.emb_projs),
                    self.cutoff_ends,
                    self.emb_scale,
                )  # one kernel, the scale included
                if scaled is not None:
                    return scaled.view(*tokens.shape, self.d_proj)
            embed = self._masked(tokens.reshape(-1)).view(*tokens.shape, self.d_proj)
        return embed * self.emb_scale

    def _by_cluster(self, flat: Tensor) -> Tensor:
        """[N] -> [N, d_proj]: each cluster's tokens embedded and projected (their positions found on the host)."""
        weight = self.emb_projs[0]
        out = torch.zeros(flat.size(0), self.d_proj, dtype=weight.dtype, device=weight.device)
        for i, (lo, hi) in enumerate(zip(self.cutoff_ends, self.cutoff_ends[1:], strict=False)):
            idx = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            emb = self.emb_layers[i](flat.index_select(0, idx) - lo)
            out = out.index_copy(0, idx, nn.functional.linear(emb, self.emb_projs[i]))
        return out

    def _masked(self, flat: Tensor) -> Tensor:
        """[N] -> [N, d_proj] with no data-dependent shape: every cluster embeds every token (clamped into its
        range) and keeps its own. No host synchronisation, so a CUDA graph can capture it; the extra work is a
        few small products per token."""
        out = None
        for i, (lo, hi) in enumerate(zip(self.cutoff_ends, self.cutoff_ends[1:], strict=False)):
            inside = (flat >= lo) & (flat < hi)
            emb = nn.functional.linear(
                self.emb_layers[i]((flat - lo).clamp(0, hi - lo - 1)), self.emb_projs[i]
            )
            part = emb * inside[:, None].to(emb.dtype)
            out = part if out is None else out + part
        assert out is not None
        return out


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """Output layer: hidden [N, d_model] -> log-probabilities, full or of given targets only."""

    def __init__(self, config: TxlConfig) -> None:
        super().__init__()
        self.n_token, self.d_embed, self.d_proj = config.vocab_size, config.d_embed, config.d_model
        self.div_val = config.div_val
        self.cutoff_ends = config.cutoff_ends
        self.shortlist_size = self.cutoff_ends[1]
        self.n_clusters = config.n_clusters
        if self.n_clusters > 0:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, self.d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))
        self.out_layers = nn.ModuleList()
        # One projection per cluster; None (no parameter) where div_val == 1 and d_embed == d_model, as in HF.
        self.out_projs = nn.ParameterList()
        n_parts = self.n_clusters + 1
        if self.div_val == 1:
            for _ in range(n_parts):
                proj = (
                    nn.Parameter(torch.zeros(self.d_proj, self.d_embed))
                    if self.d_proj != self.d_embed
                    else None
                )
                self.out_projs.append(proj)
            self.out_layers.append(nn.Linear(self.d_embed, self.n_token))
        else:
            for i in range(n_parts):
                dim = config.cluster_dim(i)
                self.out_projs.append(nn.Parameter(torch.zeros(self.d_proj, dim)))
                self.out_layers.append(nn.Linear(dim, self.cutoff_ends[i + 1] - self.cutoff_ends[i]))

    # ------------------------------------------------------------------ parts

    def _cluster_params(self, i: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Weight [n_i, d_i], bias [n_i], projection [d_model, d_i] (or None) of cluster i's words."""
        proj: Tensor | None = self.out_projs[i]
        if self.div_val == 1:
            lo, hi = self.cutoff_ends[i], self.cutoff_ends[i + 1]
            layer = cast(nn.Linear, self.out_layers[0])
            return layer.weight[lo:hi], layer.bias[lo:hi], proj
        layer = cast(nn.Linear, self.out_layers[i])
        return layer.weight, layer.bias, proj

    def _linear(
        self, x: Tensor, weight: Tensor, bias: Tensor | None, slot: str, kernels: tuple[str, ...]
    ) -> Tensor:
        return packed_linear(x, weight, bias, self, f"_packed_{slot}", kernels=kernels)

    def _logits(
        self,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor,
        proj: Tensor | None,
        slot: str,
        kernels: tuple[str, ...],
    ) -> Tensor:
        if proj is not None:
            hidden = self._linear(hidden, proj.t(), None, f"{slot}_proj", kernels)  # [N, d_i]
        return self._linear(hidden, weight, bias, slot, kernels)

    def _head_logits(self, hidden: Tensor, kernels: tuple[str, ...]) -> tuple[Tensor, Tensor | None]:
        """The head words' logits [N, shortlist] and the tail clusters' [N, n_clusters] (None without them)."""
        weight, bias, proj = self._cluster_params(0)
        projected = self._linear(hidden, proj.t(), None, "head_proj", kernels) if proj is not None else hidden
        words = self._linear(projected, weight, bias, "head", kernels)  # [N, shortlist]
        if self.n_clusters == 0:
            return words, None
        return words, self._linear(projected, self.cluster_weight, self.cluster_bias, "clusters", kernels)

    def _head_log_probs(self, hidden: Tensor, kernels: tuple[str, ...]) -> Tensor:
        """[N, shortlist + n_clusters] float32: head words, then one entry per tail cluster."""
        words, clusters = self._head_logits(hidden, kernels)
        logits = words if clusters is None else torch.cat([words, clusters], dim=-1)
        return torch.log_softmax(logits.float(), dim=-1)

    def _tail_log_probs(self, hidden: Tensor, i: int, kernels: tuple[str, ...]) -> Tensor:
        """[N, n_i] float32: log p(word | cluster i)."""
        weight, bias, proj = self._cluster_params(i)
        return torch.log_softmax(
            self._logits(hidden, weight, bias, proj, f"tail{i}", kernels).float(), dim=-1
        )

    # ------------------------------------------------------------------ public

    def log_probs(self, hidden: Tensor, path: DecodePath = REFERENCE) -> Tensor:
        """hidden [N, d_model] -> [N, vocab_size] float32 log-probabilities (for sampling); after the products,
        through two Triton kernels where `path` says so (txl.kernels.path)."""
        if path.softmax == "triton" and not torch.is_grad_enabled():
            fused = self._triton_log_probs(hidden, path.linear)
            if fused is not None:
                return fused
        head = self._head_log_probs(hidden, path.linear)
        if self.n_clusters == 0:
            return head
        out = hidden.new_empty(hidden.size(0), self.n_token, dtype=torch.float32)
        out[:, : self.shortlist_size] = head[:, : self.shortlist_size]
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.cutoff_ends[i], self.cutoff_ends[i + 1]
            cluster = head[:, self.shortlist_size + i - 1, None]  # [N, 1] log p(cluster i)
            out[:, lo:hi] = cluster + self._tail_log_probs(hidden, i, path.linear)
        return out

    def _triton_log_probs(self, hidden: Tensor, kernels: tuple[str, ...]) -> Tensor | None:
        """`log_probs` through the Triton kernels (txl.kernels.triton.softmax): the logits from the same products
        as the torch path's, then two kernels for everything after them; None where they do not apply."""
        words, clusters = self._head_logits(hidden, kernels)
        logits = [words]  # [N, shortlist], then [N, n_i] per tail cluster
        for i in range(1, self.n_clusters + 1):
            logits.append(self._logits(hidden, *self._cluster_params(i), f"tail{i}", kernels))
        return triton_softmax.adaptive_log_probs(logits, clusters)

    def target_log_probs(
        self,
        hidden: Tensor,
        targets: Tensor,
        host_targets: Sequence[int] | None = None,
        path: DecodePath = REFERENCE,
    ) -> Tensor:
        """hidden [N, d_model], targets [N] -> [N] float32 log p(target), evaluating only the clusters needed.

        `host_targets`: the same ids on the host, if the caller has them: which rows fall in which cluster is
        then found there, with no synchronisation with the device. `path`: which kernels the linear layers take."""
        head = self._head_log_probs(hidden, path.linear)
        if self.n_clusters == 0:
            return head.gather(1, targets[:, None]).squeeze(1)
        # Head words first (a tail target's entry is overwritten below).
        out = head.gather(1, targets.clamp(max=self.shortlist_size - 1)[:, None]).squeeze(1)
        ids = np.asarray(host_targets) if host_targets is not None else None
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.cutoff_ends[i], self.cutoff_ends[i + 1]
            if ids is not None:
                rows = np.nonzero((ids >= lo) & (ids < hi))[0]
                if rows.size == 0:
                    continue
                idx = torch.from_numpy(rows).to(targets.device, non_blocking=True)
            else:
                idx = ((targets >= lo) & (targets < hi)).nonzero().squeeze(1)
                if idx.numel() == 0:
                    continue
            tail = self._tail_log_probs(hidden.index_select(0, idx), i, path.linear)  # [n, n_i]
            word = tail.gather(1, (targets.index_select(0, idx) - lo)[:, None]).squeeze(1)
            out = out.index_copy(0, idx, head[idx, self.shortlist_size + i - 1] + word)
        return out
