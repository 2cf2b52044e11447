"""Relative partial-learnable multi-head attention (Dai et al., 2019, section 3.3).

For query i and key j at distance d = i - j, the score is the sum of four terms, grouped as in the paper:

    AC = (q_i + u) . k_j          content, with the global content bias u = r_w_bias
    BD = (q_i + v) . W_r R[d]     position, with the global position bias v = r_r_bias

BD is computed against keys ordered by distance (klen-1, ..., 0) and shifted into key order with `rel_shift`.
The positional keys W_r R[d] depend only on the weights, so inference takes them from a precomputed table
(`pos_keys`) instead of projecting R every step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
from torch import Tensor, nn

from .kernels import REFERENCE, DecodePath, attention_kernel, prefill_kernel
from .kernels.cpu.linear import linear
from .paged.step import GroupedStep, GroupIndices, QueryGroup

# project_kv(hidden [B, L, D]) -> (keys, values), each [B, H, L, Dh]: a layer's projection of memory hidden states.
ProjectKV = Callable[[Tensor], tuple[Tensor, Tensor]]
# The layer's input at the new positions, [B, T, D]: asked for only by memories that keep hidden states.
LayerInput = Callable[[], Tensor]


class MemoryWriter(Protocol):
    """How a dense (hidden-state) memory takes a step's keys and values: `HiddenMemory`'s writer."""

    @property
    def mem_length(self) -> int: ...

    def extend(
        self, layer: int, keys: Tensor, values: Tensor, layer_input: LayerInput, project_kv: ProjectKV
    ) -> tuple[Tensor, Tensor]: ...


@dataclass
class AttentionGroup:
    """Rows of a dense batch that share one memory (hence one memory length) during a step."""

    rows: slice
    writer: MemoryWriter
    mask: Tensor | None  # [T, K] bool, True = hidden
    klen: int  # keys attended: memory length + T
    # Training only: R [K, D] after dropout, projected by each layer with gradients. Inference reads the
    # model's precomputed positional table instead.
    pos_emb: Tensor | None = None


def rel_shift(x: Tensor) -> Tensor:
    """[..., T, K] scores indexed by (query i, distance slot) -> indexed by (query i, key j).

    Slot s of row i holds distance K-1-s; key j of query i (at position K-T+i) is at distance K-T+i-j, so
    out[i, j] = x[i, j + T-1-i]. Entries with j + T-1-i >= K (key after query) come out as other rows' values or
    zeros: they are exactly the causally masked ones.
    """
    *batch, qlen, klen = x.shape
    if qlen == 1:
        return x
    if x.requires_grad:
        # The paper's pad-and-reshape: views and a cat, whose backward is cheap.
        padded = torch.cat([x.new_zeros(*batch, qlen, 1), x], dim=-1)  # [..., T, K+1]
        return padded.view(*batch, klen + 1, qlen)[..., 1:, :].reshape(x.shape)
    # Inference: a strided view, no copy. Element (i, j) sits at flat offset (T-1) + i*(K-1) + j.
    x = x.contiguous()
    strides = list(x.stride())
    strides[-2] = klen - 1
    return x.as_strided((*batch, qlen, klen), strides, x.storage_offset() + qlen - 1)


class _Scratch(threading.local):
    """One reusable buffer per dtype and thread: a fresh multi-megabyte tensor every layer is mapped and faulted
    in anew each time, which made the copy below cost several times what its bytes do."""

    limit = 64 * 2**20  # bytes: larger operands get a plain copy instead of a buffer kept alive

    def __init__(self) -> None:
        self.buffers: dict[torch.dtype, Tensor] = {}

    def copy(self, x: Tensor) -> Tensor:
        if x.numel() * x.element_size() > self.limit:
            return x.contiguous()
        buffer = self.buffers.get(x.dtype)
        if buffer is None or buffer.numel() < x.numel():
            buffer = self.buffers[x.dtype] = torch.empty(x.numel(), dtype=x.dtype)
        return buffer[: x.numel()].view(x.shape).copy_(x)


_scratch = _Scratch()


def _dense_if_half_on_cpu(x: Tensor) -> Tensor:
    """A transposed bmm operand whose batch stride is not its matrix size (a slice of the memory or of the
    positional table) is copied by CPU half-precision bmm itself, several times more slowly than copying it
    first (docs/model.md). Same kernel after, same result. float32 reads such views in place, so it keeps them.

    The copy lands in a scratch buffer that the next call overwrites: callers use it at once (one product),
    and only outside autograd, which would keep it for the backward pass."""
    if x.dtype == torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled():
        return x
    return _scratch.copy(x)


def attention_probs(
    score: Tensor, mask: Tensor | None, dtype: torch.dtype, *, in_place: bool = False
) -> Tensor:
    """Masked softmax over keys. Half precision: computed in float32 (long rows of close scores).

    in_place: the caller's scores are its own scratch (inference), so masking overwrites them instead of
    writing a copy (one pass over the largest tensor of a prompt segment's attention saved)."""
    if mask is not None:
        fill = torch.finfo(score.dtype).min
        score = score.masked_fill_(mask, fill) if in_place else score.masked_fill(mask, fill)
    return torch.softmax(score, dim=-1, dtype=torch.float32).to(dtype)


class RelPartialLearnableMultiHeadAttn(nn.Module):
    """Attention sub-layer: projections, relative attention per memory group, output projection, residual + LN."""

    r_w_bias: nn.Parameter
    r_r_bias: nn.Parameter

    def __init__(
        self,
        n_head: int,
        d_model: int,
        d_head: int,
        dropout: float,
        *,
        dropatt: float,
        pre_lnorm: bool,
        layer_norm_epsilon: float,
        r_w_bias: nn.Parameter | None = None,
        r_r_bias: nn.Parameter | None = None,
    ) -> None:
        super().__init__()
        self.n_head, self.d_model, self.d_head = n_head, d_model, d_head
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        self.drop = nn.Dropout(dropout)
        self.dropatt = nn.Dropout(dropatt)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model, eps=layer_norm_epsilon)
        self.scale = 1 / (d_head**0.5)
        self.pre_lnorm = pre_lnorm
        if r_w_bias is None or r_r_bias is None:  # untie_r: this layer's own u and v
            self.r_w_bias = nn.Parameter(torch.zeros(n_head, d_head))
            self.r_r_bias = nn.Parameter(torch.zeros(n_head, d_head))
        else:  # one pair shared by all layers (the model owns it)
            self.r_w_bias, self.r_r_bias = r_w_bias, r_r_bias
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)

    def project_positions(self, pos_emb: Tensor) -> Tensor:
        """R [K, D] -> positional keys [H, K, Dh]."""
        klen = pos_emb.size(0)
        return self.r_net(pos_emb).view(klen, self.n_head, self.d_head).permute(1, 0, 2)

    def project_kv(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """Memory hidden states [B, L, D] -> keys, values [B, H, L, Dh] (only the k and v thirds of qkv_net)."""
        batch, length, _ = hidden.shape
        inner = self.n_head * self.d_head
        h = self.layer_norm(hidden) if self.pre_lnorm else hidden
        kv = nn.functional.linear(h, self.qkv_net.weight[inner:])  # [B, L, 2*H*Dh]
        k, v = kv.view(batch, length, 2, self.n_head, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)
        return k, v

    def decode_tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(W_qkv, W_o, LayerNorm gain, LayerNorm shift, u, v): what a fused decoding step reads
        (txl.paged.layer_weights). From the modules' registries, by name: what attribute access reads, at a small
        part of its cost (a CPU step asks every layer, to see whether one changed)."""
        modules, own = self._modules, self._parameters
        norm = modules["layer_norm"]._parameters  # type: ignore[union-attr]
        return (  # type: ignore[return-value]
            modules["qkv_net"]._parameters["weight"],  # type: ignore[union-attr]
            modules["o_net"]._parameters["weight"],  # type: ignore[union-attr]
            norm["weight"],
            norm["bias"],
            own["r_w_bias"],
            own["r_r_bias"],
        )

    def _queries(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """q [..., H, Dh] -> (q + u) * scale, (q + v) * scale: the scale is applied to the queries once, since
        (q + u)s . k = s((q + u) . k), and likewise for v."""
        return (q + self.r_w_bias) * self.scale, (q + self.r_r_bias) * self.scale

    def _output(self, x: Tensor, attn_vec: Tensor, path: DecodePath) -> Tensor:
        """attn_vec [..., H*Dh] -> output projection, residual, LayerNorm (post-norm) -> [..., D]."""
        out = self.drop(linear(attn_vec, self.o_net, path.linear))
        if self.pre_lnorm:
            return x + out
        return self.layer_norm(x + out)

    # ------------------------------------------------------------------ paged memory (inference)

    def forward_paged(
        self, x: Tensor, step: GroupedStep, layer: int, pos_table: Tensor, path: DecodePath
    ) -> Tensor:
        """x [N, D]: this layer's input at every new position of the step's rows -> [N, D].

        pos_table: this layer's positional keys [H, P', Dh] for distances P'-1..0 (P' >= step.n_pos); `path`:
        which kernels its attention and linear layers take (txl.kernels.path).
        """
        n_tokens = x.size(0)
        h = self.layer_norm(x) if self.pre_lnorm else x
        qkv = linear(h, self.qkv_net, path.linear).view(n_tokens, 3, self.n_head, self.d_head)
        q, k, v = qkv.unbind(1)  # each [N, H, Dh]
        step.write(layer, k, v, x)
        q_content, q_position = self._queries(q)
        positions = pos_table[:, pos_table.size(1) - step.n_pos :]  # [H, P, Dh], distances P-1..0
        outs = [
            group_attention(
                q_content,
                q_position,
                group,
                partial(step.indices, g),
                step.pool.keys[layer],
                step.pool.values[layer],
                positions,
                path,
            )
            for g, group in enumerate(step.groups)
        ]
        if len(outs) == 1 and outs[0].size(0) == n_tokens:
            attn_vec = outs[0]  # one group of all the step's rows: already in the step's token order
        else:
            attn_vec = torch.empty_like(q)  # [N, H, Dh]
            for group, out in zip(step.groups, outs, strict=True):
                attn_vec.index_copy_(0, group.token_index, out)
        return self._output(x, attn_vec.reshape(n_tokens, self.n_head * self.d_head), path)

    # ------------------------------------------------------------------ dense memory (training)

    def forward(
        self,
        x: Tensor,
        groups: Sequence[AttentionGroup],
        layer: int,
        pos_table: Tensor | None = None,
        path: DecodePath = REFERENCE,
    ) -> Tensor:
        """x [B, T, D] (this layer's input) -> [B, T, D], over dense hidden-state memories (training, and HF's
        form). pos_table: this layer's positional keys [H, N, Dh] for distances N-1..0 (inference), or None
        (training: each group carries R to project); `path`: which kernels its linear layers take."""
        batch, qlen, _ = x.shape
        h = self.layer_norm(x) if self.pre_lnorm else x
        qkv = linear(h, self.qkv_net, path.linear).view(batch, qlen, 3, self.n_head, self.d_head)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, T, Dh]
        q_content = (q + self.r_w_bias[:, None, :]) * self.scale  # [B, H, T, Dh]
        q_position = (q + self.r_r_bias[:, None, :]) * self.scale
        heads, d_head = self.n_head, self.d_head
        bd_all = None
        if pos_table is not None:
            # One product for every row: each group's positional keys are a suffix of the same table.
            kmax = max(g.klen for g in groups)
            positions = pos_table[:, pos_table.size(1) - kmax :]  # [H, Kmax, Dh], distances Kmax-1..0
            rows = q_position.transpose(0, 1).reshape(heads, batch * qlen, d_head)  # [H, B*T, Dh]
            bd_all = torch.bmm(rows, positions.transpose(1, 2))  # [H, B*T, Kmax] by distance slot
        parts = []
        for g in groups:
            # [b, H, K, Dh] each: the memory followed by this step's positions
            keys, values = g.writer.extend(
                layer, k[g.rows], v[g.rows], partial(x.__getitem__, g.rows), self.project_kv
            )
            b = keys.size(0)
            query = q_content[g.rows].reshape(b * heads, qlen, d_head)
            if bd_all is not None:
                bd = bd_all.view(heads, batch, qlen, -1)[:, g.rows, :, bd_all.size(-1) - g.klen :]
                bd = bd.transpose(0, 1).reshape(b * heads, qlen, g.klen)  # [b*H, T, K]
            else:
                assert g.pos_emb is not None
                positional = self.project_positions(g.pos_emb).transpose(-1, -2)  # [H, Dh, K]
                bd = torch.matmul(q_position[g.rows], positional).reshape(b * heads, qlen, g.klen)
            score = torch.baddbmm(rel_shift(bd), query, keys.flatten(0, 1).transpose(1, 2))  # [b*H, T, K]
            prob = attention_probs(score, g.mask, values.dtype)
            if self.training:
                prob = self.dropatt(prob)
            parts.append(torch.bmm(prob, values.flatten(0, 1)).view(b, heads, qlen, d_head))  # [b, H, T, Dh]
        attn_vec = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)  # [B, H, T, Dh]
        attn_vec = attn_vec.transpose(1, 2).reshape(batch, qlen, self.n_head * self.d_head)
        return self._output(x, attn_vec, path)


def group_attention(
    q_content: Tensor,
    q_position: Tensor,
    group: QueryGroup,
    indices: Callable[[], GroupIndices],
    keys: Tensor,
    values: Tensor,
    positions: Tensor,
    path: DecodePath,
) -> Tensor:
    """Attention of one query group over its rows' blocks: through the kernel `path` names where one applies
    (decoding: one query per row; a prompt segment: several), else the reference computation, plain torch.

    q_content, q_position [N, H, Dh] (scaled, biased); keys, values: this layer's pool [H, blocks, bs, Dh];
    positions [H, P, Dh] (distances P-1..0); `indices()` the group's index tensors (derived by the step once per
    forward, for the torch path only). Returns [B*T, H, Dh] in the group's token order.
    """
    heads, _, _, d_head = keys.shape
    batch, qlen, slots = group.rows, group.queries, group.key_slots

    def rows_first(q: Tensor) -> Tensor:  # [N, H, Dh] -> [H, B*T, Dh] for this group's queries
        return q.index_select(0, group.token_index).transpose(0, 1)

    kernel = attention_kernel(path, keys) if qlen == 1 else None
    if kernel is not None:
        # BD for every distance: [H, B, P]; the kernel picks each key's.
        by_distance = torch.bmm(rows_first(q_position), _dense_if_half_on_cpu(positions).transpose(1, 2))
        query = q_content.index_select(0, group.token_index).float()  # [B, H, Dh]
        out = kernel(query, by_distance.float(), keys, values, group)
        return out.to(keys.dtype)
    prefill = prefill_kernel(path, keys, q_content) if qlen > 1 else None
    if prefill is not None:
        return prefill(q_content, q_position, keys, values, positions, group, qlen)
    index = indices()
    bd = _positional_scores(rows_first(q_position), positions, group, index)  # [H, B, T, L]
    # The rows' blocks side by side: [H*n_blocks, bs*Dh] rows -> [H*B*S, bs*Dh] = [H*B, L, Dh]
    rows = keys.size(0) * keys.size(1)
    row_keys = keys.reshape(rows, -1).index_select(0, index.head_rows).view(heads * batch, slots, d_head)
    row_values = values.reshape(rows, -1).index_select(0, index.head_rows).view(heads * batch, slots, d_head)
    query = rows_first(q_content).reshape(heads * batch, qlen, d_head)
    score = torch.baddbmm(bd.reshape(heads * batch, qlen, slots), query, row_keys.transpose(1, 2))
    score = score.view(heads, batch, qlen, slots)
    prob = attention_probs(score, index.mask, values.dtype, in_place=True)  # [H, B, T, L]
    prob = prob.view(heads * batch, qlen, slots)
    out = torch.bmm(prob, row_values)  # [H*B, T, Dh]
    return out.view(heads, batch * qlen, d_head).transpose(0, 1)  # [B*T, H, Dh]


def _positional_scores(
    q_position: Tensor, positions: Tensor, group: QueryGroup, indices: GroupIndices
) -> Tensor:
    """BD for every (query, key slot): q_position [H, B*T, Dh], positions [H, P, Dh] (distances P-1..0) ->
    [H, B, T, L].

    The product against every distance is one bmm; each query then needs its own window of it, shifted by one
    column per query (the paper's relative shift). Where the host knows each row's query positions that window
    is a strided view of the product (no copy for a single row); otherwise (a CUDA graph's buffers) a gather.
    """
    heads, rows_t, _ = q_position.shape
    n_pos = positions.size(1)
    batch, qlen, slots = group.rows, group.queries, group.key_slots
    first_queries = group.first_query_positions
    if first_queries is None:
        by_distance = torch.bmm(q_position, _dense_if_half_on_cpu(positions).transpose(1, 2))
        index = indices.bd_index.expand(heads, batch, qlen, slots)
        return by_distance.view(heads, batch, qlen, n_pos).gather(3, index)
    # Element (h, b, i, j) sits at column P-1-(p_b+i-j) of row (b, i): a view with a row stride of P-1. The
    # buffer is padded on both sides so that the columns of hidden slots (before the row's first position,
    # after the query) stay inside it; what they read there is masked.
    front = max(0, max(first_queries) - (n_pos - 1))
    body = heads * rows_t * n_pos
    buffer = q_position.new_empty(front + body + slots + qlen)
    buffer[:front].zero_()
    buffer[front + body :].zero_()
    by_distance = buffer[front : front + body].view(heads, rows_t, n_pos)
    torch.bmm(q_position, _dense_if_half_on_cpu(positions).transpose(1, 2), out=by_distance)

    def window(b: int) -> Tensor:  # [H, T, L]
        offset = front + b * qlen * n_pos + (n_pos - 1 - first_queries[b])
        return buffer.as_strided((heads, qlen, slots), (rows_t * n_pos, n_pos - 1, 1), offset)

    if batch == 1:
        return window(0).unsqueeze(1)
    bd = q_position.new_empty(heads, batch, qlen, slots)
    for b in range(batch):
        bd[:, b] = window(b)
    return bd
