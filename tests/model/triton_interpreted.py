"""Run as a separate process with TRITON_INTERPRET=1 (Triton reads it when it is imported); prints one JSON line.

    python -m tests.model.triton_interpreted model [same_length]   # decoding with the kernel against the torch path
    python -m tests.model.triton_interpreted contract SEED           # random kernel inputs against float64

`model` decodes with a tiny model through the Triton kernel, layer by layer (a decode path whose layers are
torch's: the fused body has tests of its own, fused_interpreted.py), and through the torch path and reports the largest
difference of the log-probabilities. `contract` calls the kernel on random rows (every pool dtype, several block
sizes including one that is not a power of two, split and single-pass launches) and reports, per dtype, the
largest difference from the dense float64 computation, and the devices the launches were guarded with.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import sys
from collections.abc import Iterator

import torch
from txl.kernels import DecodePath
from txl.kernels.triton import decode as triton_decode
from txl.kernels.triton.decode import LaunchPlan, plan_launch, tile_keys

from tests.helpers.tiny_models import tiny_model

from .decode_cases import Case, dense_reference, random_case
from .test_kernels import _decode_both_ways


def model(same_length: bool) -> dict[str, object]:
    # Memories of 0, 1, a block boundary and past it, and long ones: split into partitions of one 64-key tile
    # (2 heads leave a GPU's SMs idle), so the combining kernel runs too.
    model = tiny_model(seed=24, mem_len=150, same_length=same_length, clamp_len=40)
    # The "kernel" side, layer by layer (the fused body has tests of its own: fused_interpreted.py); the
    # reference side is the torch path.
    path = dataclasses.replace(DecodePath.triton(), layers="torch")
    lengths = [0, 1, 3, 4, 5, 70, 200]
    got, expected = _decode_both_ways(model, lengths, mem_len=150, block_size=4, steps=2, path=path)
    return {"max_error": float((got - expected).abs().max())}


def _plans(case: Case) -> Iterator[LaunchPlan | None]:
    """The default plan (partitions of one 64-key tile), partitions of two 16-key tiles, and everything in one
    program."""
    batch, heads, d_head = case.q.shape
    width, bs, n_pos = case.rows.table.size(1), case.keys.size(2), case.bd.size(2)
    yield None
    yield LaunchPlan(16, 32, -(-min(width * bs, n_pos + 15) // 32))
    whole = plan_launch(
        batch=batch, heads=heads, d_head=d_head, table_width=width, block_size=bs, n_pos=n_pos, sms=0
    )
    assert not whole.split, whole  # no SM to fill: one partition of at most 256 keys covers these rows
    yield whole


def contract(seed: int) -> dict[str, object]:
    guarded: list[str] = []
    real_guard = triton_decode.device_guard

    def recording_guard(device: torch.device) -> contextlib.AbstractContextManager[object]:
        guarded.append(str(device))
        return real_guard(device)

    triton_decode.device_guard = recording_guard  # type: ignore[assignment]
    for dtype in (torch.float32, torch.bfloat16):  # what a server runs at start-up: both launch variants
        triton_decode.warm_up(torch.device("cpu"), dtype, heads=2, d_head=24, block_size=12)
    rng = random.Random(seed)
    worst: dict[str, float] = {}
    worst_case: dict[str, str] = {}
    cases = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        worst[name] = 0.0
        for block_size in (1, 4, 16, 12):
            d_head = rng.choice([8, 24])
            assert tile_keys(d_head) == 64
            case = random_case(
                rng, dtype=dtype, block_size=block_size, d_head=d_head, long=rng.randint(70, 140)
            )
            expected = dense_reference(case)
            for plan in _plans(case):
                got = triton_decode.triton_paged_decode(
                    case.q, case.bd, case.keys, case.values, case.rows, plan=plan
                )
                error = float((got.double() - expected).abs().max())
                cases += 1
                if error >= worst[name]:
                    worst[name], worst_case[name] = error, f"{case.describe()} plan {plan}"
    return {"max_error": worst, "worst_case": worst_case, "calls": cases, "guarded": sorted(set(guarded))}


def main() -> None:
    if sys.argv[1] == "model":
        result = model(same_length=sys.argv[2:] == ["same_length"])
    else:
        result = contract(int(sys.argv[2]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
