"""A session's model state: what one step needs from the past, and the unit the cache stores and moves."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import Tensor
from txl import BlockPool, Memory, MemoryLayout
from txl.window import WindowRule

# Detokenization may depend on the last few tokens of the context (word-level spacing).
TAIL_TOKENS = 8


@dataclass(frozen=True)
class ModelState:
    """Immutable: a step returns a new state; the old one stays valid (rollback is keeping the old one).

    A state holds its memory's blocks until its owner releases it (`release`): the state cache when a version is
    replaced or evicted, a job when it ends or fails (txl.memory). Whoever keeps a state another owner holds
    takes its own hold (`retain`)."""

    memory: Memory  # keys/values of the last positions (one row): as many as its window rule keeps
    last_hidden: Tensor | None  # [D]: the last position's output, which predicts the next token (None: empty)
    tail: tuple[int, ...]  # the last few token ids

    @property
    def fed(self) -> int:
        """Positions fed over the session's life: the memory holds the last `memory.length` of them."""
        return self.memory.rows[0].fed

    @property
    def nbytes(self) -> int:
        """Bytes this state keeps alive: its memory's blocks and the last hidden state."""
        hidden = 0 if self.last_hidden is None else self.last_hidden.numel() * self.last_hidden.element_size()
        return self.memory.allocated_nbytes + hidden

    @property
    def mem_len(self) -> int:
        return self.memory.mem_len

    @classmethod
    def empty(cls, memory: Memory) -> ModelState:
        return cls(memory, None, ())

    def retain(self) -> ModelState:
        """This state, held once more: its new owner releases it (ReleasedError if it was released already)."""
        return ModelState(self.memory.retain(), self.last_hidden, self.tail)

    def release(self) -> None:
        """Gives this state's blocks back (those no other state holds go to the pool now); idempotent."""
        self.memory.release()

    def advanced(self, memory: Memory, last_hidden: Tensor, tokens: list[int]) -> ModelState:
        if memory.rows[0].fed != self.fed + len(tokens):
            raise ValueError("the memory was not advanced by these tokens")
        return ModelState(memory, last_hidden, (*self.tail, *tokens)[-TAIL_TOKENS:])

    def owning(self) -> ModelState:
        """This state with a `last_hidden` that holds its own row only. A decoding iteration's new hidden states
        are one tensor, each row a view of it; a view kept by a session that stays idle would keep the whole
        batch's alive (and `nbytes` would not count it). Copied once, when a state leaves the worker (a request
        ends), not at each step."""
        hidden = self.last_hidden
        if hidden is None or hidden.untyped_storage().nbytes() == hidden.numel() * hidden.element_size():
            return self
        return ModelState(self.memory, hidden.clone(), self.tail)

    def moved(self, pool: BlockPool) -> ModelState:
        """A copy in another pool (tier moves between the device and the host): same values."""
        memory = self.memory.to_pool(pool)
        device = pool.layout.device
        hidden = None if self.last_hidden is None else self.last_hidden.to(device, copy=True)
        return ModelState(memory, hidden, self.tail)

    # ------------------------------------------------------------------ serialisation (snapshots, Redis tier)

    def to_bytes(self, extra: dict[str, str] | None = None) -> bytes:
        """safetensors: the memory's tensors and `last_hidden`; metadata `mem_len`, `tail`, the layout and `extra`."""
        tensors = self.memory.to_tensors()
        if self.last_hidden is not None:
            tensors["last_hidden"] = self.last_hidden.contiguous()
        layout = self.memory.layout
        meta = {
            "mem_len": str(self.memory.mem_len),
            "grid": str(self.memory.grid or 0),
            "fed": str(self.fed),
            "tail": json.dumps(list(self.tail)),
            "layout": json.dumps([layout.n_layer, layout.n_head, layout.d_head, layout.d_model]),
            **(extra or {}),
        }
        return _canonical(save_safetensors({k: v.cpu() for k, v in tensors.items()}, metadata=meta))

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        layout: MemoryLayout,
        pool: BlockPool | None = None,
        *,
        grid: int | None = None,
        same_length: bool = False,
    ) -> ModelState:
        """Inverse of `to_bytes` (into `pool`, default the layout's process-wide pool); raises ValueError if the
        snapshot does not fit the model's layout. `grid`: the window grid of a snapshot that does not record one
        (made before windows were fixed on a grid)."""
        try:
            tensors = load_safetensors(data)
            meta = _metadata(data)
            mem_len = int(meta["mem_len"])
            tail = tuple(int(t) for t in json.loads(meta["tail"]))
            fed = int(meta.get("fed", 0))
            if "grid" in meta:
                grid = int(meta["grid"]) or None
        except Exception as exc:
            raise ValueError(f"not a session snapshot: {exc}") from exc
        expected = [layout.n_layer, layout.n_head, layout.d_head, layout.d_model]
        if "layout" in meta and json.loads(meta["layout"]) != expected:
            raise ValueError("the snapshot was made by a model of another shape")
        last_hidden = tensors.pop("last_hidden", None)
        if last_hidden is not None and last_hidden.shape != (layout.d_model,):
            raise ValueError("snapshot's last hidden state does not have the model's width")
        if last_hidden is not None:
            last_hidden = last_hidden.to(dtype=layout.dtype, device=layout.device)
        tensors = {k: v.to(dtype=layout.dtype, device=layout.device) for k, v in tensors.items()}
        length = tensors["keys.0"].size(2) if "keys.0" in tensors else 0
        fed = max(fed, length)
        keep = WindowRule(mem_len, same_length, grid).keep(fed)
        memory = Memory.from_tensors(
            layout, tensors, mem_len=mem_len, pool=pool, grid=grid, fed=fed, keep=keep
        )
        return cls(memory, last_hidden, tail)


S = TypeVar("S", bound=ModelState | None)


@contextlib.contextmanager
def released(state: S) -> Iterator[S]:
    """`state` (a hold of the caller's, or None) for the block, released when it ends whatever happens: a request's
    own hold on a job's result while it is committed (the state cache keeps its own)."""
    try:
        yield state
    finally:
        if state is not None:
            state.release()


def snapshot_metadata(data: bytes) -> dict[str, str]:
    """The metadata of a snapshot made by `to_bytes`; ValueError if it is not one."""
    try:
        return _metadata(data)
    except Exception as exc:
        raise ValueError(f"not a session snapshot: {exc}") from exc


def _canonical(data: bytes) -> bytes:
    """The same safetensors file with its header's keys sorted, so that the same state gives the same bytes
    (safetensors writes the metadata in a hash map's order, which changes from one call to the next)."""
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data stays 8-byte aligned, as safetensors writes it
    return len(text).to_bytes(8, "little") + text + data[8 + header_len :]


def _metadata(data: bytes) -> dict[str, str]:
    # safetensors layout: 8-byte little-endian header length, then the JSON header with "__metadata__".
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    return dict(header.get("__metadata__", {}))
