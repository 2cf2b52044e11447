"""Segment memory: what a Transformer-XL carries from one segment to the next.

The paper's memory is the previous segments' hidden states, one `[mem_len, d_model]` block per layer, which every
step projects again into keys and values. Serving many steps over a long memory, that re-projection is most of the
work (about 82% of HF's decode time at mem_len 1,600), so `Memory` stores what attention reads: per layer, the
projected keys and values of the last `mem_len` positions. Projection is per position, so the two are the same
function.

A `Memory` is an immutable view. A step never changes the memory it was given: it returns a new one, and the old
one stays valid until dropped, so a server can roll a step back or fork a session. To avoid copying the whole
memory on every token, views share an append-only `_Storage`: a step writes its new columns after the storage's
`frontier` and the new view covers them; columns below the frontier are never written again. A second step from the
same (now older) memory finds itself behind the frontier and copies instead (copy-on-write). When the storage is
full, a step compacts the live window into a new one, which happens once every ~mem_len/8 tokens.

`HiddenMemory` is the paper's form (detached hidden states, re-projected every step with gradients flowing into the
projection): training uses it, and it is the form HF exchanges (`mems`), so memories can be imported and exported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# project_kv(hidden [B, L, D]) -> (keys, values), each [B, H, L, Dh]: a layer's projection of memory hidden states.
ProjectKV = Callable[[Tensor], tuple[Tensor, Tensor]]
# The layer's input at the new positions, [B, T, D]: asked for only by memories that keep hidden states.
LayerInput = Callable[[], Tensor]


@dataclass(frozen=True)
class MemoryLayout:
    """Shapes and placement every memory of one model shares."""

    n_layer: int
    n_head: int
    d_head: int
    d_model: int
    dtype: torch.dtype
    device: torch.device

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def bytes_per_position(self, keep_hidden: bool = False) -> int:
        """Bytes one remembered position costs, all layers: keys + values (+ hidden states)."""
        width = 2 * self.n_head * self.d_head + (self.d_model if keep_hidden else 0)
        return self.n_layer * width * self.element_size


class _Storage:
    """Append-only key/value buffers shared by successive views of one batch of sequences."""

    def __init__(self, layout: MemoryLayout, batch_size: int, capacity: int, keep_hidden: bool) -> None:
        kv_shape = (batch_size, layout.n_head, capacity, layout.d_head)
        dtype, device = layout.dtype, layout.device
        self.keys = [torch.empty(kv_shape, dtype=dtype, device=device) for _ in range(layout.n_layer)]
        self.values = [torch.empty(kv_shape, dtype=dtype, device=device) for _ in range(layout.n_layer)]
        hidden_shape = (batch_size, capacity, layout.d_model)
        self.hidden = (
            [torch.empty(hidden_shape, dtype=dtype, device=device) for _ in range(layout.n_layer)]
            if keep_hidden
            else None
        )
        self.capacity = capacity
        # Columns [0, frontier) are written and immutable; a step may only write at or after it.
        self.frontier = 0

    @property
    def nbytes(self) -> int:
        tensors = self.keys + self.values + (self.hidden or [])
        return sum(t.numel() * t.element_size() for t in tensors)


class Memory:
    """Keys and values of the last <= `mem_len` positions of a batch of `batch_size` sequences, per layer.

    All rows of one memory hold the same number of positions. Sequences of different lengths batch together as a
    list of memories (one per group of equal length): `model(tokens, [m1, m2, ...])`.
    """

    __slots__ = ("_storage", "batch_size", "end", "keep_hidden", "layout", "mem_len", "start")

    def __init__(
        self,
        layout: MemoryLayout,
        *,
        batch_size: int = 1,
        mem_len: int,
        keep_hidden: bool = False,
        storage: _Storage | None = None,
        start: int = 0,
        end: int = 0,
    ) -> None:
        if mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {mem_len}")
        self.layout = layout
        self.batch_size = batch_size
        self.mem_len = mem_len
        self.keep_hidden = keep_hidden
        self._storage = storage
        self.start = start
        self.end = end

    # ------------------------------------------------------------------ reading

    @property
    def length(self) -> int:
        """Positions held (the same for every row)."""
        return self.end - self.start

    def __len__(self) -> int:
        return self.length

    def keys(self, layer: int) -> Tensor:
        """[B, H, L, Dh] view; empty when nothing is held."""
        if self._storage is None:
            return self._empty_kv()
        return self._storage.keys[layer][:, :, self.start : self.end]

    def values(self, layer: int) -> Tensor:
        if self._storage is None:
            return self._empty_kv()
        return self._storage.values[layer][:, :, self.start : self.end]

    def hidden_states(self) -> list[Tensor]:
        """Per layer [B, L, d_model]: the input of each layer at the held positions (HF's `mems`, batch first)."""
        if not self.keep_hidden:
            raise ValueError("this memory does not keep hidden states; create it with keep_hidden=True")
        if self._storage is None or self._storage.hidden is None:
            shape = (self.batch_size, 0, self.layout.d_model)
            return [
                torch.empty(shape, dtype=self.layout.dtype, device=self.layout.device)
            ] * self.layout.n_layer
        return [h[:, self.start : self.end] for h in self._storage.hidden]

    def _empty_kv(self) -> Tensor:
        shape = (self.batch_size, self.layout.n_head, 0, self.layout.d_head)
        return torch.empty(shape, dtype=self.layout.dtype, device=self.layout.device)

    @property
    def nbytes(self) -> int:
        """Exact bytes of the positions held (keys and values, plus hidden states if kept)."""
        return self.batch_size * self.length * self.layout.bytes_per_position(self.keep_hidden)

    @property
    def allocated_nbytes(self) -> int:
        """Bytes of the buffers this view keeps alive (shared with other views of the same storage)."""
        return 0 if self._storage is None else self._storage.nbytes

    @property
    def storage_key(self) -> int | None:
        """Identifies the buffers behind this view: views with equal keys share their bytes (count them once)."""
        return None if self._storage is None else id(self._storage)

    def shares_storage_with(self, other: Memory) -> bool:
        return self._storage is not None and self._storage is other._storage

    def __repr__(self) -> str:
        return (
            f"Memory(batch={self.batch_size}, length={self.length}, mem_len={self.mem_len}, "
            f"dtype={self.layout.dtype}, device={self.layout.device}, nbytes={self.nbytes})"
        )

    # ------------------------------------------------------------------ new views

    def with_mem_len(self, mem_len: int) -> Memory:
        """The same memory governed by another `mem_len`; shrinking drops the oldest positions (no copy)."""
        start = max(self.start, self.end - mem_len)
        return Memory(
            self.layout,
            batch_size=self.batch_size,
            mem_len=mem_len,
            keep_hidden=self.keep_hidden,
            storage=self._storage if start < self.end else None,
            start=start if start < self.end else 0,
            end=self.end if start < self.end else 0,
        )

    def compact(
        self, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> Memory:
        """A copy in a storage of its own, sized to what is held plus room to decode a while (for tier moves,
        snapshots, and trimming the headroom a long ingestion left)."""
        layout = MemoryLayout(
            self.layout.n_layer,
            self.layout.n_head,
            self.layout.d_head,
            self.layout.d_model,
            dtype or self.layout.dtype,
            torch.device(device) if device is not None else self.layout.device,
        )
        return Memory.from_tensors(layout, self.to_tensors(), mem_len=self.mem_len)

    def to_tensors(self) -> dict[str, Tensor]:
        """Contiguous tensors of what is held: `keys.{i}`/`values.{i}` [B, H, L, Dh], `hidden.{i}` [B, L, D]."""
        out: dict[str, Tensor] = {}
        for i in range(self.layout.n_layer):
            out[f"keys.{i}"] = self.keys(i).contiguous()
            out[f"values.{i}"] = self.values(i).contiguous()
        if self.keep_hidden:
            for i, h in enumerate(self.hidden_states()):
                out[f"hidden.{i}"] = h.contiguous()
        return out

    @classmethod
    def from_tensors(cls, layout: MemoryLayout, tensors: dict[str, Tensor], *, mem_len: int) -> Memory:
        """Inverse of `to_tensors`; checks every shape against the layout. Keeps at most `mem_len` positions."""
        try:
            first = tensors["keys.0"]
        except KeyError as exc:
            raise ValueError("memory tensors lack 'keys.0'") from exc
        if first.dim() != 4:
            raise ValueError(f"keys.0 must be [B, H, L, Dh], got shape {tuple(first.shape)}")
        batch, _, length, _ = first.shape
        keep_hidden = "hidden.0" in tensors
        expected = {f"keys.{i}" for i in range(layout.n_layer)} | {
            f"values.{i}" for i in range(layout.n_layer)
        }
        if keep_hidden:
            expected |= {f"hidden.{i}" for i in range(layout.n_layer)}
        if set(tensors) != expected:
            missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
            raise ValueError(f"memory tensors do not match the model: missing {missing}, unexpected {extra}")
        kv_shape = (batch, layout.n_head, length, layout.d_head)
        for name, t in tensors.items():
            want = (batch, length, layout.d_model) if name.startswith("hidden.") else kv_shape
            if tuple(t.shape) != want:
                raise ValueError(f"memory tensor {name} has shape {tuple(t.shape)}, expected {want}")
        keep = min(length, mem_len)
        if keep == 0:
            return cls(layout, batch_size=batch, mem_len=mem_len, keep_hidden=keep_hidden)
        # Sized to what is held (plus decoding headroom), not to mem_len: a short session at rest costs little.
        storage = _Storage(layout, batch, keep + _decode_headroom(mem_len), keep_hidden)
        for i in range(layout.n_layer):
            storage.keys[i][:, :, :keep].copy_(tensors[f"keys.{i}"][:, :, length - keep :])
            storage.values[i][:, :, :keep].copy_(tensors[f"values.{i}"][:, :, length - keep :])
            if storage.hidden is not None:
                storage.hidden[i][:, :keep].copy_(tensors[f"hidden.{i}"][:, length - keep :])
        storage.frontier = keep
        return cls(
            layout, batch_size=batch, mem_len=mem_len, keep_hidden=keep_hidden, storage=storage, end=keep
        )

    # ------------------------------------------------------------------ stepping (used by the model)

    def writer(self, seg_len: int) -> _MemoryWriter:
        return _MemoryWriter(self, seg_len)


def peak_positions(mem_len: int, seg_len: int) -> int:
    """The most positions a memory's buffers hold while it is fed segments of `seg_len` tokens: what a
    session's memory can cost at worst between compactions (budgets and capacity planning need this, not
    `mem_len + seg_len`)."""
    return _capacity(mem_len, mem_len, seg_len) if mem_len else seg_len


def _capacity(mem_len: int, held: int, seg_len: int) -> int:
    # A compaction copies the whole window, so headroom sets how often that happens: after mem_len/8 decoded
    # tokens (8 positions copied per token appended), or after 4 segments when whole segments are being fed
    # (scoring and long appends, where copying every other segment cost a third of the time). The next
    # compaction sizes the buffer to the steps taken then, so a decoding session does not keep the larger one.
    headroom = max(4 * seg_len if seg_len > 1 else 0, _decode_headroom(mem_len))
    return max(mem_len, held) + seg_len + headroom


def _decode_headroom(mem_len: int) -> int:
    return max(mem_len // 8, 16)


class _MemoryWriter:
    """One step's writes: appends each layer's new keys/values and returns everything attention reads."""

    def __init__(self, memory: Memory, seg_len: int) -> None:
        self.memory = memory
        self.seg_len = seg_len
        old = memory._storage
        if old is not None and old.frontier == memory.end and memory.end + seg_len <= old.capacity:
            self.storage, self.base = old, memory.start
        else:
            capacity = _capacity(memory.mem_len, memory.length, seg_len) if memory.mem_len else seg_len
            self.storage = _Storage(memory.layout, memory.batch_size, capacity, memory.keep_hidden)
            self.base = 0
            if old is not None:
                n = memory.length
                for i in range(memory.layout.n_layer):
                    self.storage.keys[i][:, :, :n].copy_(memory.keys(i))
                    self.storage.values[i][:, :, :n].copy_(memory.values(i))
                    if self.storage.hidden is not None and old.hidden is not None:
                        self.storage.hidden[i][:, :n].copy_(old.hidden[i][:, memory.start : memory.end])
        self.write_at = self.base + memory.length
        # Claim the columns now: a failed step leaves them unused, never shared with another view.
        self.storage.frontier = self.write_at + seg_len

    @property
    def mem_length(self) -> int:
        return self.memory.length

    def extend(
        self, layer: int, keys: Tensor, values: Tensor, layer_input: LayerInput, project_kv: ProjectKV
    ) -> tuple[Tensor, Tensor]:
        """keys/values [B, H, T, Dh] of the new positions -> [B, H, mlen + T, Dh] of memory and new positions."""
        a, b = self.write_at, self.write_at + self.seg_len
        all_keys = self.storage.keys[layer][:, :, self.base : b]
        all_values = self.storage.values[layer][:, :, self.base : b]
        all_keys[:, :, a - self.base :].copy_(keys)
        all_values[:, :, a - self.base :].copy_(values)
        if self.storage.hidden is not None:
            self.storage.hidden[layer][:, a:b].copy_(layer_input())
        return all_keys, all_values

    def finish(self) -> Memory:
        m = self.memory
        end = self.write_at + self.seg_len
        start = max(self.base, end - m.mem_len)
        if start == end:  # mem_len == 0: nothing is remembered
            return Memory(m.layout, batch_size=m.batch_size, mem_len=0, keep_hidden=m.keep_hidden)
        return Memory(
            m.layout,
            batch_size=m.batch_size,
            mem_len=m.mem_len,
            keep_hidden=m.keep_hidden,
            storage=self.storage,
            start=start,
            end=end,
        )


@dataclass(frozen=True)
class HiddenMemory:
    """The paper's memory: per layer, detached layer inputs [B, L, d_model] of the last <= mem_len positions.

    Each step re-projects it with the current weights, so gradients reach the key/value projections through the
    memory positions too (but not the hidden states themselves: they are constants). Used for training.
    """

    hidden: tuple[Tensor, ...]
    mem_len: int
    batch_size: int

    @classmethod
    def empty(
        cls, n_layer: int, batch_size: int, d_model: int, mem_len: int, *, like: Tensor
    ) -> HiddenMemory:
        block = like.new_zeros(batch_size, 0, d_model)
        return cls(tuple(block for _ in range(n_layer)), mem_len, batch_size)

    @property
    def length(self) -> int:
        return self.hidden[0].size(1)

    def writer(self, seg_len: int) -> _HiddenWriter:
        return _HiddenWriter(self, seg_len)


class _HiddenWriter:
    def __init__(self, memory: HiddenMemory, seg_len: int) -> None:
        self.memory = memory
        self.seg_len = seg_len
        self.inputs: list[Tensor] = []

    @property
    def mem_length(self) -> int:
        return self.memory.length

    def extend(
        self, layer: int, keys: Tensor, values: Tensor, layer_input: LayerInput, project_kv: ProjectKV
    ) -> tuple[Tensor, Tensor]:
        self.inputs.append(layer_input())
        past = self.memory.hidden[layer]
        if past.size(1) == 0:
            return keys, values
        past_keys, past_values = project_kv(past)
        return torch.cat([past_keys, keys], dim=2), torch.cat([past_values, values], dim=2)

    def finish(self) -> HiddenMemory:
        m = self.memory
        with torch.no_grad():
            hidden = tuple(
                torch.cat([past, new.detach()], dim=1)[:, -m.mem_len :] if m.mem_len else past[:, :0]
                for past, new in zip(m.hidden, self.inputs, strict=True)
            )
        return HiddenMemory(hidden, m.mem_len, m.batch_size)
