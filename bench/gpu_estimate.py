"""The wt103 decoding step on an H200, ESTIMATED (no GPU has run these kernels yet): bfloat16, memory 1,600, at 1,
16 and 64 rows, through the fused body as a CUDA graph, against the HBM floor of the bytes it must read.

A model of where the time goes, from the kernels' own launch plans (`plan_rows`, `plan_partitions`, the
LayerNorm's constants) and the constants below, which are assumptions, not measurements (the bandwidth is what a
device-to-device copy reached on this workplace's H200; the latencies are typical Hopper figures). Each kernel
takes the longer of its bytes over the bandwidth and the chain of round trips its slowest program waits on; a
graph adds a gap per launch. "Before" is the third review's account of the code it read (main ab36bf5: the last
program of a row block normalising every row, reading each row's `splits` partial rows in turn; attention
partitions of four tiles; two more launches a step). The row linears' products are modelled at the same rate
before and now, though before every load of theirs was of 2 bytes and none pipelined (`do_not_specialize` on the
weight's shape): "before" is the least it cost. `python -m bench gpu` measures the kernels and the step; replace
this section with its figures once a GPU has run it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import txl
from txl.kernels.triton import attention as triton_attention
from txl.kernels.triton import layer_norm as triton_layer_norm
from txl.kernels.triton import rows_linear as triton_rows_linear
from txl_server.check.benchmark_docs import Section

BANDWIDTH = 4.3e12  # bytes/s: a device-to-device copy on this workplace's H200, read + written
PEAK = 4.8e12  # bytes/s: the H200's HBM3e, for the floor
SMS = 132
GAP = 1.2e-6  # s between kernels of a CUDA graph (launch, ramp, drain)
L2_TRIP = (0.25e-6, 0.4e-6)  # s: a dependent load from L2 (low, high)
HBM_TRIP = 0.7e-6  # s: a dependent load from HBM
ATOMIC = 0.5e-6  # s: the arrival count of a last-arriver (fence, atomic, its return)
RESIDENT_ATTENTION = 18  # one-warp attention programs an SM holds (about 110 registers)
MEM = 1600


@dataclass(frozen=True)
class Shape:
    layers: int
    d_model: int
    heads: int
    d_head: int
    d_inner: int
    vocab: int
    head_bytes: int  # the adaptive softmax's weights and projections

    @property
    def layer_bytes(self) -> int:
        return 2 * (4 * self.d_model * self.heads * self.d_head + 2 * self.d_model * self.d_inner)


def wt103_shape() -> Shape:
    config = txl.TxlConfig(dropout=0.0)
    with torch.device("meta"):
        model = txl.TransfoXLLMHeadModel(config).to(torch.bfloat16)
    crit = sum(p.numel() for n, p in model.named_parameters() if n.startswith("crit"))
    emb = model.transformer.word_emb
    tied = sum(
        layer.weight.numel() for layer in emb.emb_layers
    )  # the output layer's words are the embedding's
    return Shape(config.n_layer, config.d_model, config.n_head, config.d_head, config.d_inner, config.vocab_size,
                 2 * (crit + tied))  # fmt: skip


def rows_linear_seconds(shape: Shape, rows: int, inputs: int, trip: float, *, before: bool) -> float:
    """A row linear with its residual and LayerNorm: the weight's pass, then the epilogue's round trips."""
    weight = 2 * shape.d_model * inputs
    main = max(weight / (0.7 * BANDWIDTH), 2e-6)
    if before:  # one program: per row, the residual and `splits` partial rows (unrolled 4x), two reductions
        plan = triton_rows_linear.plan_rows(rows=rows, outputs=shape.d_model, inputs=inputs, sms=SMS)
        per_row = (1 + math.ceil((plan.splits - 1) / 4) + 1) * trip + 0.3e-6
        return main + min(rows, plan.block_m) * per_row + 2 * ATOMIC
    plan = triton_rows_linear.plan_rows(rows=rows, outputs=shape.d_model, inputs=inputs, sms=SMS, norm=True)
    sums = math.ceil(plan.splits / 4) * trip + ATOMIC  # each tile's last split: four partial tiles a read
    groups = math.ceil(rows / triton_layer_norm.GROUP_ROWS)  # statistics, then y: two reads a group
    if rows <= triton_layer_norm.IN_KERNEL_ROWS:
        return main + sums + ATOMIC + groups * 2 * trip  # the last tile, group after group
    return main + sums + GAP + 2 * HBM_TRIP  # the LayerNorm's own launch: a group a program, in parallel


def attention_seconds(shape: Shape, rows: int, tiles: int) -> float:
    """The fused attention of one layer, partitions of `tiles` tiles: the longer of its bytes (keys, values, the
    positional keys, the partitions' sums) and its programs' chains of round trips, wave after wave; then the last
    program of a row combines the partitions' sums."""
    tile, _ = triton_attention.tile_and_warps(shape.d_head)
    table = -(-(MEM + 1) // 16) + 1
    partitions = -(-min(table * 16, MEM + tile) // (tiles * tile))
    programs = rows * shape.heads * partitions
    kv = rows * (MEM + 1) * shape.heads * shape.d_head * 2 * 2
    positional = (MEM + 1) * shape.heads * shape.d_head * 2
    sums = 2 * programs * (shape.d_head + 2) * 4  # written, then read by the last program of each row
    moved = (kv + positional + sums) / BANDWIDTH
    # The row's numbers (L2: the projection just wrote them), then per tile its block numbers (L2) and its keys,
    # positional keys and values (HBM), in turn; then the arrival.
    chain = L2_TRIP[1] + tiles * (L2_TRIP[1] + HBM_TRIP) + ATOMIC
    chunk = 16 if tiles == 4 else triton_attention.COMBINE_CHUNK  # (four tiles: before, 16 a read)
    combine = (1 + math.ceil(partitions / chunk)) * L2_TRIP[1]
    waves = math.ceil(programs / (SMS * RESIDENT_ATTENTION))
    return max(moved, waves * chain) + combine


def step_seconds(shape: Shape, rows: int, trip: float, *, before: bool) -> dict[str, float]:
    """Seconds of a step by part."""
    gemv = lambda size: max(size / (0.75 * BANDWIDTH), 3e-6)  # noqa: E731 - cuBLAS at a few rows
    per_layer = {
        "products (cuBLAS)": gemv(2 * 3 * shape.heads * shape.d_head * shape.d_model)
        + gemv(2 * shape.d_inner * shape.d_model),
        "attention": attention_seconds(shape, rows, 4 if before else triton_attention.PARTITION_TILES),
        "row linears": rows_linear_seconds(shape, rows, shape.heads * shape.d_head, trip, before=before)
        + rows_linear_seconds(shape, rows, shape.d_inner, trip, before=before),
    }
    launches = 5 + (2 if not before and rows > triton_layer_norm.IN_KERNEL_ROWS else 0)
    parts = {name: shape.layers * seconds for name, seconds in per_layer.items()}
    logits = rows * shape.vocab * (2 * 3 + 4 * 3)  # the clusters' logits written and read, log-probs
    parts["output layer and sampling"] = (
        shape.head_bytes / (0.75 * BANDWIDTH) + 9 * 2e-6 + logits / BANDWIDTH + 6e-6
        + 2 * max(rows * shape.vocab * 4 / BANDWIDTH, 4e-6)
    )  # fmt: skip
    parts["gaps between launches"] = (shape.layers * launches + 14 + (2 if before else 0)) * GAP
    return parts


def floor_seconds(shape: Shape, rows: int) -> float:
    kv = rows * shape.layers * (MEM + 1) * shape.heads * shape.d_head * 2 * 2
    positional = shape.layers * (MEM + 1) * shape.heads * shape.d_head * 2
    return (shape.layers * shape.layer_bytes + shape.head_bytes + kv + positional) / PEAK


def run(quick: bool = False) -> Section:
    section = Section("gpu_estimate", "The wt103 step on an H200, estimated", "python -m bench gpu_estimate")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    section.note(
        f"Assumptions: copy bandwidth {BANDWIDTH / 1e12:.1f} TB/s (floor: HBM3e's {PEAK / 1e12:.1f}); {SMS} SMs; "
        f"{GAP * 1e6:.1f} us between a graph's kernels; a dependent read {L2_TRIP[0] * 1e6:.2f}-"
        f"{L2_TRIP[1] * 1e6:.2f} us from L2, {HBM_TRIP * 1e6:.1f} us from HBM; {ATOMIC * 1e6:.1f} us a last-arriver's "
        f"count; {RESIDENT_ATTENTION} attention programs resident an SM; cuBLAS and the row linears' products at "
        "75% and 70% of the copy bandwidth, 2-3 us at least. The HBM floor: every weight once, each row's keys "
        "and values, the positional keys."
    )
    shape = wt103_shape()
    rows_table, parts_table = [], []
    for rows in (1, 16, 64):
        floor = floor_seconds(shape, rows)
        estimates = {}
        for before in (True, False):
            low, high = (sum(step_seconds(shape, rows, trip, before=before).values()) for trip in L2_TRIP)
            estimates[before] = (low, high)
        (b_low, b_high), (a_low, a_high) = estimates[True], estimates[False]
        rows_table.append([rows, floor * 1e3, f"{b_low * 1e3:.2f}-{b_high * 1e3:.2f}",
                           f"{a_low * 1e3:.2f}-{a_high * 1e3:.2f}", f"{a_low / floor:.1f}-{a_high / floor:.1f}",
                           f"{rows / a_high:,.0f}-{rows / a_low:,.0f}"])  # fmt: skip
        for name, seconds in step_seconds(shape, rows, L2_TRIP[1], before=False).items():
            before_part = step_seconds(shape, rows, L2_TRIP[1], before=True)[name]
            parts_table.append([rows, name, before_part * 1e3, seconds * 1e3])
    section.table(
        f"wt103 step, bfloat16, memory {MEM:,}: ESTIMATED ms (low-high: L2 round trips of 0.25-0.4 us)",
        ["rows", "HBM floor (ms)", "before (ms)", "now (ms)", "now, x floor", "now, tokens/s"],
        rows_table,
    )
    section.table(
        "Where the time goes, ESTIMATED ms a step (L2 round trips of 0.4 us)",
        ["rows", "part", "before", "now"],
        parts_table,
    )
    section.table(
        "The attention's partitions: ESTIMATED ms a step, by tiles of keys a partition",
        ["rows", "1 tile", "2 tiles (now)", "4 tiles (before)"],
        [[rows, *(shape.layers * attention_seconds(shape, rows, tiles) * 1e3 for tiles in (1, 2, 4))]
         for rows in (1, 16, 64)],
    )  # fmt: skip
    return section
