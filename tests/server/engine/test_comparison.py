"""How the start-up checks judge a path against the eager torch path (engine.comparison): in half precision a path
is right when it is about as close to float32 as the torch path is, whatever the depth of the model, and a wrong
path is still found out."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import txl
from txl.sampling import SamplingParams
from txl_server.engine.comparison import FLOAT32_FACTOR, compare_paths, tolerance
from txl_server.engine.rows import DecodeRow
from txl_server.engine.runner import ModelRunner
from txl_server.engine.selfcheck import Float32Model

from tests.helpers.tiny_models import tiny_model

MEM_LEN = 64


@pytest.fixture(scope="module")
def deep():
    """A 24-layer bfloat16 model (deeper than wt103) and four decoding rows over memories of 10 to 63 positions."""
    model = tiny_model(
        seed=3, n_layer=24, d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=64, mem_len=MEM_LEN
    ).to(torch.bfloat16)
    pool = txl.BlockPool(model.memory_layout(), block_size=4)
    generator = torch.Generator().manual_seed(3)
    rows = []
    with torch.inference_mode():
        for i, n in enumerate((10, 30, 47, 63)):
            memory = model.empty_memory(1, mem_len=MEM_LEN, pool=pool)
            hidden, memory = model(torch.randint(0, 64, (1, n), generator=generator), memory)
            params = SamplingParams(temperature=0.8, seed=i)
            rows.append(DecodeRow(memory, hidden[0, -1].clone(), params, seed=i, counter=0))
    return model, pool, rows


def _paths(deep):
    model, pool, rows = deep
    reference = ModelRunner(model, pool).decode(rows)
    exact = Float32Model(model).step(rows)
    return model, reference, exact


def _with_hidden(outputs, hidden):
    """`outputs` with the decoding rows' hidden states replaced (the scored segment's row, last, kept)."""
    return [
        dataclasses.replace(out, last_hidden=hidden[i].to(torch.bfloat16)) if i < len(hidden) else out
        for i, out in enumerate(outputs)
    ]


def _drifted(truth, size, seed):
    """`truth` off by `size` of its largest value, as bfloat16 rounding 18 layers deep leaves trained weights'
    hidden states (random weights, as here, stay within a unit of rounding, whatever their depth)."""
    generator = torch.Generator().manual_seed(seed)
    return [
        t + size * float(t.abs().max()) * torch.randn(t.shape, generator=generator).clamp(-1, 1)
        for t in truth
    ]


def test_a_path_closer_to_float32_than_the_torch_path_is_not_turned_off(deep):
    """The torch path drifting from float32 beyond the fixed limit (as on a deep model with trained weights): a
    path as exact as float32 (its result rounded once), or as far from it as the torch path in another direction,
    differs from the torch path by more than the limit. The old check (the limit alone) turned such a path off;
    it passes now, as one about as close to float32 as the torch path is."""
    model, reference, exact = _paths(deep)
    truth = exact(reference)
    torch_path = _with_hidden(reference, _drifted(truth, 0.08, seed=1))
    for path in (_with_hidden(reference, truth), _with_hidden(reference, _drifted(truth, 0.08, seed=2))):
        check = compare_paths("right", lambda path=path: path, lambda: torch_path, model.dtype, exact)
        assert check.hidden > tolerance(torch.bfloat16).hidden  # beyond the limit alone: the old check failed
        assert check.float32 is not None and check.float32 <= FLOAT32_FACTOR and check.ok, check.problem()
        without = compare_paths("right", lambda path=path: path, lambda: torch_path, model.dtype)
        assert not without.ok  # what the old check said
    wrong = _with_hidden(reference, _drifted(truth, 0.5, seed=3))
    check = compare_paths("wrong", lambda: wrong, lambda: torch_path, model.dtype, exact)
    assert not check.ok and check.float32 is not None and check.float32 > FLOAT32_FACTOR


@pytest.mark.parametrize("fault", ["noise", "wrong row", "nan"])
def test_a_wrong_path_is_still_found_out_in_half_precision(deep, fault):
    model, reference, exact = _paths(deep)

    def broken(out, i):
        hidden = out.last_hidden.float()
        if fault == "noise":
            hidden = hidden + 0.5 * torch.randn(hidden.shape, generator=torch.Generator().manual_seed(i))
        elif fault == "wrong row":
            hidden = reference[(i + 1) % (len(reference) - 1)].last_hidden.float()
        else:
            hidden = torch.full_like(hidden, float("nan"))
        return dataclasses.replace(out, last_hidden=hidden.to(torch.bfloat16))

    wrong = [broken(out, i) if i < len(reference) - 1 else out for i, out in enumerate(reference)]
    check = compare_paths("wrong", lambda: wrong, lambda: reference, model.dtype, exact)
    assert not check.ok and "hidden states off by" in check.problem()
    assert check.float32 is None or check.float32 > FLOAT32_FACTOR


def test_float32_is_asked_only_beyond_the_tolerance(deep):
    model, reference, _ = _paths(deep)
    asked = []

    def exact(outputs):
        asked.append(1)
        return []

    check = compare_paths("same", lambda: reference, lambda: reference, model.dtype, exact)
    assert check.ok and check.float32 is None and not asked
