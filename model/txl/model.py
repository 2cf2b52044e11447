"""Transformer-XL language model (Dai et al., 2019, "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context", https://arxiv.org/abs/1901.02860).

The same function as HF transformers 4.35.2 `TransfoXLLMHeadModel` (attention type 0), with the same parameter
names, so HF checkpoints load unchanged. What differs is how state is carried: memory goes in and comes out
explicitly, `hidden, new_memory = model(tokens, memory)`, the model holds no session state, and the memory keeps
projected keys/values instead of hidden states (see memory.py).

Shapes are batch-first: tokens [B, T], hidden [B, T, D]; attention tensors [B, H, T, K] with K = mlen + T.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast, overload

import torch
from torch import Tensor, nn

from .adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax
from .attention import AttentionGroup, RelPartialLearnableMultiHeadAttn
from .config import TxlConfig
from .feedforward import PositionwiseFF
from .kernels import REFERENCE, DecodePath
from .memory import HiddenMemory, Memory
from .paged import fused_decode, gpu_decode
from .paged.layer_weights import LayerWeights
from .paged.layout import MemoryLayout
from .paged.pool import BlockPool, Reservation, default_pool
from .paged.rows import PagedRow
from .paged.step import GroupedStep, PagedStep
from .positional import PositionalEmbedding, attention_mask
from .window import WindowRule

AnyMemory = Memory | HiddenMemory


class RelPartialLearnableDecoderLayer(nn.Module):
    def __init__(
        self, config: TxlConfig, r_w_bias: nn.Parameter | None, r_r_bias: nn.Parameter | None
    ) -> None:
        super().__init__()
        self.dec_attn = RelPartialLearnableMultiHeadAttn(
            config.n_head,
            config.d_model,
            config.d_head,
            config.dropout,
            dropatt=config.dropatt,
            pre_lnorm=config.pre_lnorm,
            layer_norm_epsilon=config.layer_norm_epsilon,
            r_w_bias=r_w_bias,
            r_r_bias=r_r_bias,
        )
        self.pos_ff = PositionwiseFF(
            config.d_model,
            config.d_inner,
            config.dropout,
            pre_lnorm=config.pre_lnorm,
            layer_norm_epsilon=config.layer_norm_epsilon,
        )

    def forward(
        self,
        x: Tensor,
        groups: Sequence[AttentionGroup],
        layer: int,
        pos_table: Tensor | None,
        path: DecodePath = REFERENCE,
    ) -> Tensor:
        return self.pos_ff(self.dec_attn(x, groups, layer, pos_table, path), path)

    def forward_paged(
        self, x: Tensor, step: GroupedStep, layer: int, pos_table: Tensor, path: DecodePath
    ) -> Tensor:
        return self.pos_ff(self.dec_attn.forward_paged(x, step, layer, pos_table, path), path)

    def decode_weights(self) -> LayerWeights:
        """This layer's tensors and constants as a fused decoding step reads them (txl.paged.layer_weights)."""
        attn = cast(RelPartialLearnableMultiHeadAttn, self._modules["dec_attn"])  # as `self.dec_attn`, faster
        ff = cast(PositionwiseFF, self._modules["pos_ff"])
        qkv, out, norm1, norm1_bias, u, v = attn.decode_tensors()
        inner, inner_bias, outer, outer_bias, norm2, norm2_bias = ff.decode_tensors()
        eps1 = cast(nn.LayerNorm, attn._modules["layer_norm"]).eps
        eps2 = cast(nn.LayerNorm, ff._modules["layer_norm"]).eps
        return LayerWeights(
            qkv, out, inner, inner_bias, outer, outer_bias, norm1, norm1_bias, norm2, norm2_bias, u, v,
            eps1, eps2, attn.scale, attn.pre_lnorm,
        )  # fmt: skip


class TransfoXLModel(nn.Module):
    """Embedding and decoder stack (HF's `transformer.` submodule)."""

    r_w_bias: nn.Parameter  # only when not config.untie_r
    r_r_bias: nn.Parameter

    def __init__(self, config: TxlConfig) -> None:
        super().__init__()
        self.config = config
        self.word_emb = AdaptiveEmbedding(config)
        self.drop = nn.Dropout(config.dropout)
        shared_w = shared_r = None
        if not config.untie_r:  # registered before the layers, so these names come first in the state dict
            self.r_w_bias = shared_w = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.r_r_bias = shared_r = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.layers = nn.ModuleList(
            RelPartialLearnableDecoderLayer(config, shared_w, shared_r) for _ in range(config.n_layer)
        )
        self.pos_emb = PositionalEmbedding(config.d_model)
        # Inference cache of positional keys: per layer [H, N, Dh], rows for distances N-1..0.
        self._pos_table: list[Tensor] = []
        self._pos_table_key: tuple = ()
        self._pos_reserved = 0

    @property
    def attentions(self) -> list[RelPartialLearnableMultiHeadAttn]:
        """Each layer's attention sub-layer, typed (ModuleList items are plain Modules to a type checker)."""
        return [cast(RelPartialLearnableDecoderLayer, layer).dec_attn for layer in self.layers]

    def memory_layout(self) -> MemoryLayout:
        weight = self.attentions[0].qkv_net.weight
        c = self.config
        return MemoryLayout(c.n_layer, c.n_head, c.d_head, c.d_model, weight.dtype, weight.device)

    def reserve_positions(self, klen: int) -> list[Tensor]:
        """Sizes the positional table for key lengths up to `klen` now, once: a server reserves the longest any
        step will ask for, so the table is never reallocated while it serves (a CUDA graph that captured it would
        read freed memory). Returns the tables."""
        self._pos_reserved = max(self._pos_reserved, klen)
        return self.positional_tables(klen)

    def positional_tables(self, klen: int) -> list[Tensor]:
        """Per layer, W_r R for distances N-1..0 ([H, N, Dh], N >= klen): a table grown on demand (new tensors;
        whoever holds the old ones keeps valid ones) and remade when the weights change."""
        attentions = self.attentions
        weights = [attn.r_net.weight for attn in attentions]
        key = tuple((w.data_ptr(), w._version, w.dtype) for w in weights)
        if key != self._pos_table_key or not self._pos_table or self._pos_table[0].size(1) < klen:
            size = max(
                klen,
                self._pos_reserved,
                2 * self._pos_table[0].size(1) if self._pos_table and key == self._pos_table_key else 0,
            )
            with torch.no_grad():
                pos_emb = self.pos_emb.for_keys(size, self.config.clamp_len).to(weights[0].dtype)  # [N, D]
                self._pos_table = [attn.project_positions(pos_emb).contiguous() for attn in attentions]
            self._pos_table_key = key
        return self._pos_table

    def forward(
        self, tokens: Tensor, memories: Sequence[AnyMemory], path: DecodePath = REFERENCE
    ) -> tuple[Tensor, list[AnyMemory]]:
        """tokens [B, T]; memories: one per group of rows, in row order, batch sizes summing to B; `path`: which
        kernels the step takes (txl.kernels.path; the reference, torch's operations, by default).

        Returns the last layer's output [B, T, D] and the new memories (same order). The given memories are
        not modified.
        """
        batch, qlen = tokens.shape
        if sum(m.batch_size for m in memories) != batch:
            raise ValueError(
                f"memories cover {sum(m.batch_size for m in memories)} rows, tokens have {batch}"
            )
        if qlen == 0:
            raise ValueError("a step needs at least one token")
        if all(isinstance(m, Memory) for m in memories):
            return self._forward_paged(tokens, cast(Sequence[Memory], memories), path)
        if not all(isinstance(m, HiddenMemory) for m in memories):
            raise TypeError(
                "one step takes either paged memories (Memory) or hidden-state memories, not both"
            )
        return self._forward_dense(tokens, cast(Sequence[HiddenMemory], memories), path)

    def _forward_paged(
        self, tokens: Tensor, memories: Sequence[Memory], path: DecodePath
    ) -> tuple[Tensor, list[AnyMemory]]:
        pool = memories[0].pool
        if any(m.pool is not pool for m in memories):
            raise ValueError("memories stepped together must live in one pool")
        rows = [row for m in memories for row in m.rows]
        rules = [m.rule(self.config.same_length) for m in memories for _ in m.rows]
        batch, qlen = tokens.shape
        hidden, results = self.forward_rows(tokens.reshape(-1), [qlen] * batch, rows, rules, pool, path=path)
        out: list[AnyMemory] = []
        for m in memories:
            out.append(m.like(results[: m.batch_size], owns=True))
            results = results[m.batch_size :]
        return hidden.view(batch, qlen, -1), out

    @torch.no_grad()
    def forward_rows(
        self,
        tokens: Tensor,
        queries: Sequence[int],
        rows: Sequence[PagedRow],
        rules: Sequence[WindowRule],
        pool: BlockPool,
        reservation: Reservation | None = None,
        *,
        path: DecodePath = REFERENCE,
        before_layers: Callable[[], None] | None = None,
    ) -> tuple[Tensor, list[PagedRow]]:
        """One forward over rows of a pool: row r feeds queries[r] tokens (packed in `tokens` [N], row by row)
        after its memory `rows[r]`, its queries' windows and what it keeps given by rules[r] (txl.window),
        through the kernels `path` names.

        Returns the last layer's output [N, D] and each row's memory after the step, each holding its table once:
        the caller's to release (`Memory.like(rows, owns=True)` makes it their owner). Inference only; a step that
        fails gives back what it took. `before_layers`: see `forward_step`.
        """
        if pool.layout != self.memory_layout():
            raise ValueError(f"the memory pool holds {pool.layout}, the model needs {self.memory_layout()}")
        step = PagedStep(pool, rows, queries, rules, reservation=reservation)
        try:
            hidden = self.forward_step(tokens, step, path=path, before_layers=before_layers)
        except BaseException:
            step.release(results=True)
            raise
        results = step.results
        step.release()
        return hidden, results

    @torch.no_grad()
    def forward_step(
        self,
        tokens: Tensor,
        step: GroupedStep,
        tables: Sequence[Tensor] | None = None,
        *,
        out: Tensor | None = None,
        path: DecodePath = REFERENCE,
        before_layers: Callable[[], None] | None = None,
    ) -> Tensor:
        """tokens [N] -> last layer's output [N, D], for a step already planned (its blocks claimed), through the
        kernels `path` names: its fused layers where they apply (txl.paged.gpu_decode, txl.paged.fused_decode),
        else layer by layer.

        `tables`: per layer, positional keys covering at least `step.n_pos` distances (default: the model's own
        table); a captured graph passes the tables it captured, which it keeps alive. `out` [N, D]: where the
        output goes (a graph's static buffer; the GPU's fused body writes it there from its last kernel).
        `before_layers`: called once, when everything is prepared and the layers are about to run (the longest
        stretch a CPU step spends in native code, off the GIL: a server hands out what the last step made then,
        txl_server.engine)."""
        step.begin()
        hidden = self.drop(self.word_emb(tokens, path))  # [N, D]
        if tables is None:
            tables = self.positional_tables(step.n_pos)
        layers = cast(Sequence[RelPartialLearnableDecoderLayer], self.layers)
        if gpu_decode.applies(path, layers, step, self.training):
            if before_layers is not None:
                before_layers()
            return gpu_decode.forward(layers, step, hidden, tables, out=out)
        fused = fused_decode.applies(path, layers, step, self.training)
        if fused is not None:
            hidden = fused_decode.forward(fused, cast(PagedStep, step), hidden, tables, before_layers)
        else:
            if before_layers is not None:
                before_layers()
            for i, layer in enumerate(layers):
                hidden = layer.forward_paged(hidden, step, i, tables[i], path)
        return hidden if out is None else out.copy_(hidden)

    def _forward_dense(
        self, tokens: Tensor, memories: Sequence[HiddenMemory], path: DecodePath
    ) -> tuple[Tensor, list[AnyMemory]]:
        """Hidden-state memories: training (gradients through the memory's projections) and HF's form."""
        qlen = tokens.size(1)
        hidden = self.drop(self.word_emb(tokens, path))  # [B, T, D]
        # Training re-projects R every step (gradients reach r_net); inference reads the cached table.
        project_positions = self.training and torch.is_grad_enabled()
        groups = []
        kmax = 0
        row = 0
        for memory in memories:
            writer = memory.writer(qlen)
            mlen = writer.mem_length
            klen = mlen + qlen
            mask = attention_mask(
                qlen=qlen,
                mlen=mlen,
                mem_len=memory.mem_len,
                same_length=self.config.same_length,
                device=tokens.device,
            )
            pos_emb = None
            if project_positions:
                pos_emb = self.drop(self.pos_emb.for_keys(klen, self.config.clamp_len).to(hidden.dtype))
            groups.append(AttentionGroup(slice(row, row + memory.batch_size), writer, mask, klen, pos_emb))
            row += memory.batch_size
            kmax = max(kmax, klen)
        tables: list[Tensor | None] = [None] * len(self.layers)
        if not project_positions:
            tables = list(self.positional_tables(kmax))
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, groups, i, tables[i], path)
        hidden = self.drop(hidden)
        return hidden, [g.writer.finish() for g in groups]  # type: ignore[attr-defined]


class TransfoXLLMHeadModel(nn.Module):
    """Transformer-XL with its adaptive softmax head (HF `TransfoXLLMHeadModel`)."""

    def __init__(self, config: TxlConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = TransfoXLModel(config)
        self.crit = ProjectedAdaptiveLogSoftmax(config)
        self.tie_weights()

    # ------------------------------------------------------------------ structure

    def tie_weights(self) -> None:
        """Share output weights/projections with the input embedding as the config says (HF semantics)."""
        c, emb, crit = self.config, self.transformer.word_emb, self.crit
        if c.tie_word_embeddings:
            for out_layer, emb_layer in zip(crit.out_layers, emb.emb_layers, strict=True):
                cast(nn.Linear, out_layer).weight = cast(nn.Embedding, emb_layer).weight
        assert c.tie_projs is not None
        for i, tie in enumerate(c.tie_projs):
            if tie and c.div_val == 1 and c.d_model != c.d_embed:
                crit.out_projs[i] = emb.emb_projs[0]
            elif tie and c.div_val != 1:
                crit.out_projs[i] = emb.emb_projs[i]
        if not c.untie_r:
            for attn in self.transformer.attentions:
                attn.r_w_bias = self.transformer.r_w_bias
                attn.r_r_bias = self.transformer.r_r_bias

    def tied_names(self) -> dict[str, str]:
        """Each state-dict name that aliases another parameter -> the name it aliases (the first one)."""
        first: dict[int, str] = {}
        aliases = {}
        for name, tensor in self.state_dict(keep_vars=True).items():
            owner = first.setdefault(id(tensor), name)
            if owner != name:
                aliases[name] = owner
        return aliases

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Fresh weights as HF initialises them (normal, std 0.02; projections 0.01; LayerNorm gain 1)."""
        for name, param in self.named_parameters():
            if "layer_norm" in name:
                param.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias") and not name.endswith(("r_w_bias", "r_r_bias")):
                param.zero_()
            elif "projs" in name:
                param.normal_(0.0, 0.01, generator=generator)
            else:
                param.normal_(0.0, 0.02, generator=generator)
        self.transformer.pos_emb.reset_buffers()

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.attentions[0].qkv_net.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.transformer.attentions[0].qkv_net.weight.device

    # ------------------------------------------------------------------ memory

    def memory_layout(self) -> MemoryLayout:
        return self.transformer.memory_layout()

    def empty_memory(
        self,
        batch_size: int = 1,
        *,
        mem_len: int | None = None,
        keep_hidden: bool = False,
        pool: BlockPool | None = None,
        grid: int | None = None,
    ) -> Memory:
        """A memory holding nothing (unlike HF's `mems=None`, which starts from mem_len zero vectors), in `pool`
        (default: the process-wide pool for this model's layout). `grid`: fix every query's window on an absolute
        segment grid, so that the memory is a function of its tokens however they are cut into steps
        (`txl.window`; `config.segment_len` is the grid the model was trained on); None: HF's windows."""
        if pool is None:
            pool = default_pool(self.memory_layout(), keep_hidden=keep_hidden)
        elif pool.keep_hidden != keep_hidden:
            raise ValueError("the pool's hidden-state setting does not match keep_hidden")
        mem_len = self.config.mem_len if mem_len is None else mem_len
        return Memory(pool, batch_size=batch_size, mem_len=mem_len, grid=grid)

    @torch.no_grad()
    def memory_from_hidden(
        self,
        hidden: Sequence[Tensor],
        *,
        mem_len: int | None = None,
        keep_hidden: bool = False,
        pool: BlockPool | None = None,
    ) -> Memory:
        """Import HF-style memory: per layer hidden states [B, L, D] (transpose HF's [L, B, D] `mems` first)."""
        if len(hidden) != self.config.n_layer:
            raise ValueError(f"need {self.config.n_layer} layers of hidden states, got {len(hidden)}")
        layout = self.memory_layout()
        tensors = {}
        for i, (h, attn) in enumerate(zip(hidden, self.transformer.attentions, strict=True)):
            h = h.to(dtype=layout.dtype, device=layout.device)
            tensors[f"keys.{i}"], tensors[f"values.{i}"] = attn.project_kv(h)
            if keep_hidden:
                tensors[f"hidden.{i}"] = h
        return Memory.from_tensors(
            layout, tensors, mem_len=self.config.mem_len if mem_len is None else mem_len, pool=pool
        )

    def empty_hidden_memory(self, batch_size: int, *, mem_len: int | None = None) -> HiddenMemory:
        like = self.transformer.attentions[0].qkv_net.weight
        c = self.config
        return HiddenMemory.empty(
            c.n_layer, batch_size, c.d_model, c.mem_len if mem_len is None else mem_len, like=like
        )

    # ------------------------------------------------------------------ stepping

    @overload
    def forward(self, tokens: Tensor, memory: Memory, *, path: DecodePath = ...) -> tuple[Tensor, Memory]: ...
    @overload
    def forward(
        self, tokens: Tensor, memory: HiddenMemory, *, path: DecodePath = ...
    ) -> tuple[Tensor, HiddenMemory]: ...
    @overload
    def forward(
        self, tokens: Tensor, memory: Sequence[AnyMemory], *, path: DecodePath = ...
    ) -> tuple[Tensor, list[AnyMemory]]: ...

    def forward(self, tokens, memory, *, path=REFERENCE):
        """`hidden, new_memory = model(tokens, memory)`: tokens [B, T] -> last hidden states [B, T, D].

        `memory` is one memory for the whole batch, or a list of memories (groups of rows, in order) when rows
        hold different lengths; the result mirrors it. Feed hidden states to `log_probs` or `target_log_probs`.
        `path`: which kernels compute the step (txl.kernels.path): by default torch's operations, the reference;
        `txl.kernels.fastest(device)` is the fastest this machine runs.
        """
        if isinstance(memory, (Memory, HiddenMemory)):
            hidden, (new_memory,) = self.transformer(tokens, [memory], path)
            return hidden, new_memory
        return self.transformer(tokens, list(memory), path)

    def log_probs(self, hidden: Tensor, path: DecodePath = REFERENCE) -> Tensor:
        """hidden [..., D] -> [..., vocab] float32 log-probabilities of the next token."""
        flat = hidden.reshape(-1, hidden.size(-1))
        return self.crit.log_probs(flat, path).view(*hidden.shape[:-1], -1)

    def target_log_probs(
        self,
        hidden: Tensor,
        targets: Tensor,
        host_targets: Sequence[int] | None = None,
        *,
        path: DecodePath = REFERENCE,
    ) -> Tensor:
        """hidden [..., D], targets [...] -> [...] float32 log p(target); never builds the full distribution.
        `host_targets` (the flat ids, on the host) spares the device a synchronisation."""
        flat = hidden.reshape(-1, hidden.size(-1))
        return self.crit.target_log_probs(flat, targets.reshape(-1), host_targets, path).view(targets.shape)
