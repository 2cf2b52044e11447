"""Runs one iteration on the device: sampling for the decoding rows, one forward over every row, scoring, through
the kernels of its decode path (`txl.kernels.DecodePath`, chosen at start-up by `engine.selfcheck`), which it
passes to every call that computes.

Decoding rows sample their next token from the hidden state their last step left (on the device: parameters
and seeds go in as tensors), and that token is fed in the same forward as the ingesting rows' segments. Scoring
stays on the device too: a segment's token log-probabilities are kept as a device tensor and summed there. The
host reads results once per iteration, and only what it needs: the sampled ids and their log-probs (the full
distribution crosses only for rows that asked for top log-probs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor
from txl import BlockPool, Memory, TransfoXLLMHeadModel
from txl.kernels import REFERENCE, DecodePath
from txl.sampling import RowParams, sample_rows
from txl.scoring import shifted

from .graphs import DecodeGraphs
from .launched import Launched
from .rows import ChunkOut, ChunkRow, DecodeOut, DecodeRow, TopLogprobs


class ModelRunner:
    def __init__(
        self,
        model: TransfoXLLMHeadModel,
        pool: BlockPool,
        path: DecodePath = REFERENCE,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.path = path  # which kernels every step takes
        # Called once a step, when it is prepared (sampled, planned) and its layers are about to run
        # (TransfoXLModel.forward_step): the worker hands out the last iteration's events then (engine.jobs.Outbox).
        self.before_layers: Callable[[], None] | None = None
        self.device = pool.layout.device
        self.vocab = model.config.vocab_size
        self.graphs = graphs  # decoding-only iterations as CUDA graphs (made on `path`)

    @classmethod
    def serving(
        cls,
        model: TransfoXLLMHeadModel,
        pool: BlockPool,
        path: DecodePath,
        max_batch_size: int,
        max_positions: int,
    ) -> ModelRunner:
        """A worker's runner on `path`, with its decoding graphs where the path names them (on a CPU their static
        buffers, run eagerly), a runner on the same path without them as their fallback. `max_positions`: the
        most positions a memory holds between steps."""
        graphs = None
        if path.graphs != "off":
            eager = cls(model, pool, path).decode
            graphs = DecodeGraphs(
                model, pool, path, eager=eager, max_batch_size=max_batch_size, max_positions=max_positions
            )
        return cls(model, pool, path, graphs)

    @property
    def path_now(self) -> DecodePath:
        """The path as it runs now: with graphs "off" where they were turned off since (engine.graphs)."""
        if self.path.graphs != "off" and (self.graphs is None or self.graphs.off is not None):
            return dataclasses.replace(self.path, graphs="off")
        return self.path

    def can_launch(self, decode: Sequence[DecodeRow]) -> bool:
        """Whether these decoding rows can be sent without waiting for them (as a graph: `launch`)."""
        return self.graphs is not None and self.graphs.supports(decode)

    def launch(self, decode: Sequence[DecodeRow]) -> Launched:
        assert self.graphs is not None
        return self.graphs.launch(decode)

    def decode(self, rows: Sequence[DecodeRow]) -> list[DecodeOut]:
        """A decoding-only iteration (what the graphs fall back to, given a runner without graphs)."""
        return self.run(rows, [])[0]

    @torch.inference_mode()
    def run(
        self, decode: Sequence[DecodeRow], chunks: Sequence[ChunkRow]
    ) -> tuple[list[DecodeOut], list[ChunkOut]]:
        """One iteration: the decoding rows' next tokens and the chunks fed (calling `before_layers` once)."""
        before_layers = self.before_layers
        if not chunks and self.graphs is not None and self.graphs.supports(decode):
            if before_layers is not None:
                before_layers()
            return self.graphs.run(decode), []
        model = self.model
        sampled = self._sample(decode) if decode else None
        pieces = [sampled[0]] if sampled is not None else []
        if chunks:
            flat = [t for c in chunks for t in c.tokens]
            pieces.append(torch.tensor(flat, dtype=torch.long, device=self.device))
        tokens = torch.cat(pieces) if len(pieces) > 1 else pieces[0]  # [N]
        rows = [r.memory for r in decode] + [c.memory for c in chunks]
        queries = [1] * len(decode) + [len(c.tokens) for c in chunks]
        same_length = model.config.same_length
        rules = [m.rule(same_length) for m in rows]
        hidden, results = model.transformer.forward_rows(
            tokens,
            queries,
            [m.rows[0] for m in rows],
            rules,
            self.pool,
            path=self.path,
            before_layers=before_layers,
        )  # [N, D]
        # Each row's memory after the step holds its blocks: the task that takes it releases it.
        memories = [m.like([r], owns=True) for m, r in zip(rows, results, strict=True)]
        try:
            return self._outputs(decode, chunks, queries, hidden, memories, sampled)
        except BaseException:
            for memory in memories:
                memory.release()
            raise

    def _outputs(
        self,
        decode: Sequence[DecodeRow],
        chunks: Sequence[ChunkRow],
        queries: list[int],
        hidden: Tensor,
        memories: list[Memory],
        sampled: tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None] | None,
    ) -> tuple[list[DecodeOut], list[ChunkOut]]:
        """The iteration's outputs: tokens sampled, segments' last hidden states and scores, memories after."""
        if chunks:
            offsets = np.cumsum([0, *queries])
            last = hidden.index_select(0, torch.from_numpy(offsets[1:] - 1).to(self.device))  # [R, D]
            chunk_outs = self._chunks(
                chunks, hidden, offsets[len(decode) :], last[len(decode) :], memories[len(decode) :]
            )
        else:  # decoding rows alone, one query each: each output row is its row's last (no index to build)
            last, chunk_outs = hidden, []
        decode_outs = []
        if sampled is not None:
            ids, logprobs, top = self._fetch(sampled, [r.top_logprobs for r in decode])
            for i in range(len(decode)):
                decode_outs.append(DecodeOut(ids[i], logprobs[i], top[i], memories[i], last[i].clone()))
        return decode_outs, chunk_outs

    def _sample(self, decode: Sequence[DecodeRow]) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
        hidden = torch.stack([r.last_hidden for r in decode])  # [Nd, D]
        log_probs = self.model.log_probs(hidden, self.path)  # [Nd, V] float32
        params = RowParams.build(
            [r.params for r in decode],
            [r.seed for r in decode],
            [r.counter for r in decode],
            self.vocab,
            self.device,
        )
        tokens, logprobs = sample_rows(log_probs, params, path=self.path)
        want = max(r.top_logprobs for r in decode)
        top = torch.topk(log_probs, min(want, self.vocab), dim=-1) if want else None
        return tokens, logprobs, (top.values, top.indices) if top is not None else None

    def _fetch(
        self, sampled: tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None], wants: list[int]
    ) -> tuple[list[int], list[float], list[TopLogprobs | None]]:
        """The one host read of an iteration: ids, their log-probs and any top log-probs, in one copy."""
        tokens, logprobs, top = sampled
        if top is None and tokens.device.type == "cpu":  # nothing to copy: read the values where they are
            return tokens.tolist(), logprobs.tolist(), [None] * tokens.numel()
        parts = [tokens.double(), logprobs.double()]
        if top is not None:
            parts += [top[0].double().flatten(), top[1].double().flatten()]
        host = torch.cat(parts).cpu()
        n = tokens.numel()
        ids = host[:n].long().tolist()
        values = host[n : 2 * n].tolist()
        tops: list[TopLogprobs | None] = [None] * n
        if top is not None:
            k = top[0].size(1)
            top_values = host[2 * n : 2 * n + n * k].view(n, k).tolist()
            top_ids = host[2 * n + n * k :].view(n, k).long().tolist()
            for i, want in enumerate(wants):
                if want:
                    tops[i] = tuple(zip(top_ids[i][:want], top_values[i][:want], strict=True))
        return ids, values, tops

    def _chunks(
        self,
        chunks: Sequence[ChunkRow],
        hidden: Tensor,
        offsets: np.ndarray,
        last: Tensor,
        memories: list[Memory],
    ) -> list[ChunkOut]:
        scored = [i for i, c in enumerate(chunks) if c.score]
        logprobs: dict[int, Tensor] = {}
        tops: dict[int, list[TopLogprobs | None]] = {}
        if scored:
            predictors, targets, spans = [], [], []
            for i in scored:
                c, start, end = chunks[i], int(offsets[i]), int(offsets[i + 1])
                inner, known = shifted(hidden[start:end], c.tokens, c.last_hidden)
                predictors.append(inner)
                targets.extend(known)
                spans.append(len(known))
            flat_predictors = torch.cat(predictors)  # [M, D]
            flat_targets = torch.tensor(targets, dtype=torch.long, device=self.device)
            want = max(chunks[i].top_logprobs for i in scored)
            if want:
                full = self.model.log_probs(flat_predictors, self.path)  # [M, V]: needed for the alternatives
                values = full.gather(1, flat_targets[:, None])[:, 0]
                top = torch.topk(full, min(want, self.vocab), dim=-1)
                top_values, top_ids = top.values.tolist(), top.indices.tolist()
            else:
                values = self.model.target_log_probs(
                    flat_predictors, flat_targets, targets, path=self.path
                )  # [M]
            cursor = 0
            for i, span in zip(scored, spans, strict=True):
                part = values[cursor : cursor + span]
                if chunks[i].last_hidden is None:  # nothing predicts the first token
                    part = torch.cat([part.new_full((1,), float("nan")), part])
                logprobs[i] = part
                if want and chunks[i].top_logprobs:
                    k = chunks[i].top_logprobs
                    rows = [
                        tuple(zip(top_ids[j][:k], top_values[j][:k], strict=True))
                        for j in range(cursor, cursor + span)
                    ]
                    tops[i] = ([None] if chunks[i].last_hidden is None else []) + rows
                cursor += span
        return [
            ChunkOut(memories[i], last[i].clone(), logprobs.get(i), tops.get(i)) for i in range(len(chunks))
        ]
