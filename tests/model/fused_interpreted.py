"""Run as a separate process with TRITON_INTERPRET=1 (Triton reads it when it is imported); prints one JSON line.

    python -m tests.model.fused_interpreted kernels SEED   # each kernel of the fused decoding body against torch
    python -m tests.model.fused_interpreted sampling       # the Triton sampler against the torch path and a sort
    python -m tests.model.fused_interpreted model          # a tiny model decoding through the fused body

`kernels`: the fused attention on random rows (float32 and bfloat16 pools, block sizes 1, 4, 12 and 16, split and
single-pass launches) against the float64 computation of its contract, and the new keys and values it writes;
the row linears (every tile of rows, split or not, with and without the LayerNorm, the bias and the ReLU on the
input) against torch; the adaptive embedding and log-softmax against the torch path. `sampling`: top-p's search
against a full sort, and the tokens drawn against the torch path's, with the number given and with the counter
hash in the kernel. `model`: a tiny model decoding through the fused body and through the torch path.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys

import torch
import txl
from txl.kernels import REFERENCE, DecodePath
from txl.kernels.triton import attention as triton_attention
from txl.kernels.triton import embedding as triton_embedding
from txl.kernels.triton import rows_linear as triton_rows_linear
from txl.kernels.triton import sampling as triton_sampling
from txl.kernels.triton.decode import LaunchPlan, plan_launch
from txl.kernels.triton.rows_linear import RowsPlan
from txl.sampling import RowParams, SamplingParams, sample_rows

from tests.helpers.tiny_models import tiny_model

from .decode_cases import Case, dense_reference, random_case
from .test_kernels import _decode_both_ways
from .test_sampling import _rows_of_every_kind, _sorted_thresholds

TRITON = DecodePath.triton()  # every part of a decoding step as Triton kernels


def _rounded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).to(torch.float64)


def _attention_case(rng: random.Random, dtype: torch.dtype, block_size: int) -> dict[str, object]:
    """A random decoding case as the fused kernel takes it, and the float64 reference of its contract."""
    base = random_case(rng, dtype=dtype, block_size=block_size, d_head=8, long=rng.randint(40, 90))
    rows = base.rows
    batch, heads, d_head = base.q.shape
    n_pos = base.bd.size(2)
    table_positions = n_pos + rng.choice([0, 3])  # the positional table may be longer than the step needs
    generator = torch.Generator().manual_seed(rng.randint(0, 2**31))
    qkv = torch.randn(batch, 3, heads, d_head, generator=generator).to(dtype)
    u, v = (torch.randn(heads, d_head, generator=generator).to(dtype) for _ in range(2))
    positions = torch.randn(heads, table_positions, d_head, generator=generator).to(dtype)
    scale = 1 / math.sqrt(d_head)
    p = rows.starts + rows.key_lengths - 1  # each query's position in its table
    write_blocks = rows.table[torch.arange(batch), p // block_size]
    write_slots = p % block_size
    # The reference: the new keys and values in the pool, the queries and positional scores rounded as the
    # torch path rounds them, then the kernel's contract (decode_cases).
    keys, values = base.keys.clone(), base.values.clone()
    keys[:, write_blocks, write_slots] = qkv[:, 1].transpose(0, 1)
    values[:, write_blocks, write_slots] = qkv[:, 2].transpose(0, 1)
    q = qkv[:, 0].double()
    q_content = _rounded(_rounded(q + u.double(), dtype) * scale, dtype)  # [B, H, Dh]
    q_position = _rounded(_rounded(q + v.double(), dtype) * scale, dtype)
    by_distance = positions[:, table_positions - n_pos :].double()  # [H, P, Dh], distances P-1..0
    bd = _rounded(torch.einsum("bhd,hpd->hbp", q_position, by_distance), dtype)  # [H, B, P]
    expected = dense_reference(Case(q_content.float(), bd.float(), keys, values, rows))
    return dict(
        qkv=qkv.reshape(batch, -1),
        u=u,
        v=v,
        positions=positions,
        keys=base.keys.clone(),
        values=base.values.clone(),
        rows=rows,
        write_blocks=write_blocks,
        write_slots=write_slots,
        scale=scale,
        n_pos=n_pos,
        expected=expected,
        new_keys=qkv[:, 1],
        new_values=qkv[:, 2],
    )


def attention(seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    worst: dict[str, float] = {}
    written = True
    launches = 0
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        worst[name] = 0.0
        for block_size in (1, 4, 12, 16):
            case = _attention_case(rng, dtype, block_size)
            rows, keys = case["rows"], case["keys"]
            width = rows.table.size(1)
            single = plan_launch(
                batch=len(rows.starts), heads=2, d_head=8, table_width=width, block_size=block_size,
                n_pos=case["n_pos"], sms=0,
            )  # fmt: skip
            tile, _ = triton_attention.tile_and_warps(8)
            split = LaunchPlan(tile, tile, -(-min(width * block_size, case["n_pos"] + tile - 1) // tile))
            for plan in (None, split, single):  # default, one tile a partition, one partition
                pool_keys, pool_values = keys.clone(), case["values"].clone()
                got = triton_attention.decode_attention(
                    case["qkv"], case["u"], case["v"], case["positions"], pool_keys, pool_values, rows,
                    case["write_blocks"], case["write_slots"], scale=case["scale"], n_pos=case["n_pos"], plan=plan,
                )  # fmt: skip
                launches += 1
                expected = case["expected"]
                error = float((got.double().view(expected.shape) - expected).abs().max())
                worst[name] = max(worst[name], error / max(1.0, float(expected.abs().max())))
                new_k = pool_keys[:, case["write_blocks"], case["write_slots"]].transpose(0, 1)
                new_v = pool_values[:, case["write_blocks"], case["write_slots"]].transpose(0, 1)
                written &= torch.equal(new_k, case["new_keys"]) and torch.equal(new_v, case["new_values"])
    return {"max_error": worst, "written": written, "launches": launches}


def linear(seed: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(seed)
    worst: dict[str, float] = {"float32": 0.0, "bfloat16": 0.0}
    cases = 0
    for dtype in (torch.float32, torch.bfloat16):
        for rows, inputs, outputs in ((1, 80, 48), (17, 64, 40), (70, 40, 24)):  # tiles of 16, 32 and 64 rows
            x = torch.randn(rows, inputs, generator=generator).to(dtype)
            w = (torch.randn(outputs, inputs, generator=generator) / 8).to(dtype)
            bias, gain, shift = (torch.randn(outputs, generator=generator).to(dtype) for _ in range(3))
            lift = torch.randn(inputs, generator=generator).to(dtype)
            residual = torch.randn(rows, outputs, generator=generator).to(dtype)
            relu = torch.relu(x.double() + lift.double()).to(dtype).double()
            product = relu @ w.double().T + bias.double()
            normed = torch.nn.functional.layer_norm(
                residual.double() + product, (outputs,), gain.double(), shift.double(), 1e-5
            )
            for plan in (None, RowsPlan(16, 16, 16, 3, 32)):
                if plan is not None and rows > 16:
                    plan = dataclasses.replace(plan, block_m=64 if rows > 32 else 32)
                plain = triton_rows_linear.rows_linear(x, w, bias, plan=plan)
                fused = triton_rows_linear.rows_linear(
                    x, w, bias, relu_input=lift, residual=residual, norm=(gain, shift, 1e-5), plan=plan
                )
                reference = x.double() @ w.double().T + bias.double()
                name = str(dtype).removeprefix("torch.")
                worst[name] = max(
                    worst[name],
                    float((plain.double() - reference).abs().max() / reference.abs().max()),
                    float((fused.double() - normed).abs().max() / normed.abs().max()),
                )
                cases += 1
    return {"max_error": worst, "cases": cases}


def adaptive() -> dict[str, object]:
    """The embedding and the log-softmax of a model with four clusters, against the torch path."""
    config = txl.TxlConfig.tiny(vocab_size=9000, cutoffs=[1000, 3000, 8000], d_model=48, d_embed=48)
    model = tiny_model(seed=5, vocab_size=9000, cutoffs=[1000, 3000, 8000], d_model=48, d_embed=48)
    assert model.config.n_clusters == 3 and config.div_val == 2
    tokens = torch.tensor([0, 999, 1000, 2999, 3000, 7999, 8000, 8999, 17])
    errors = {}
    for dtype in (torch.float32, torch.bfloat16):
        m = model.to(dtype)
        hidden = torch.randn(3, 48, generator=torch.Generator().manual_seed(1)).to(dtype)
        with torch.inference_mode():
            expected, embedded = m.log_probs(hidden, REFERENCE), m.transformer.word_emb(tokens, REFERENCE)
            got, fused = m.log_probs(hidden, TRITON), m.transformer.word_emb(tokens, TRITON)
        emb = m.transformer.word_emb
        direct = triton_embedding.adaptive_embedding(
            tokens,
            [layer.weight for layer in emb.emb_layers],
            list(emb.emb_projs),
            emb.cutoff_ends,
            emb.emb_scale,
        )
        assert direct is not None and torch.equal(direct, fused)
        name = str(dtype).removeprefix("torch.")
        ulp = torch.finfo(dtype).eps * float(embedded.abs().max())
        errors[name] = {
            "log_probs": float((got - expected).abs().max()),
            "embedding_ulps": float((fused.double() - embedded.double()).abs().max()) / ulp,
        }
    return errors


def kernels(seed: int) -> dict[str, object]:
    return {"attention": attention(seed), "linear": linear(seed), "adaptive": adaptive()}


def sampling() -> dict[str, object]:
    # Chunks of 1,024 words instead of 4,096 (a compile-time constant of the kernels): three to a row of 3,000,
    # at a quarter of the interpreter's time.
    triton_sampling.CHUNK = 1024
    log_probs = _rows_of_every_kind(3000, torch.Generator().manual_seed(11))
    n = log_probs.size(0)
    thresholds: dict[str, list[list[float]]] = {"triton": [], "sorted": []}
    for temperature in (1.0, 0.7):
        for top_p in (0.05, 0.9, 0.999):
            got = triton_sampling.nucleus_thresholds(
                log_probs, torch.full((n,), temperature), torch.full((n,), top_p)
            )
            tempered = (log_probs - log_probs.amax(-1, keepdim=True)) / temperature
            thresholds["triton"].append(got.tolist())
            thresholds["sorted"].append([_sorted_thresholds(row, 0, top_p) for row in tempered])
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.2, top_k=7),
        SamplingParams(top_p=0.6),
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
    ]
    compared = differ = 0
    hashed_differ = 0
    for i, p in enumerate(params):
        for draw in range(2):
            seeds = [2**62 + 977 * k * (draw + 1) - (2**63 if k % 2 else 0) for k in range(n)]
            rows = RowParams.build([p] * n, seeds, [5 * k + i for k in range(n)], log_probs.size(1), "cpu")
            readback = torch.zeros(n, 2, dtype=torch.float64)
            expected, _ = sample_rows(log_probs, rows, path=REFERENCE)
            tokens, logprobs = sample_rows(log_probs, rows, readback, path=TRITON)
            hashed, _ = sample_rows(log_probs, dataclasses.replace(rows, uniform=None), path=TRITON)
            assert readback[:, 0].tolist() == tokens.tolist() and readback[:, 1].tolist() == logprobs.tolist()
            assert torch.equal(logprobs, log_probs.gather(1, tokens[:, None])[:, 0])
            compared += n
            differ += int((tokens != expected).sum())
            hashed_differ += int((hashed != expected).sum())
    # A number that rounds to the whole kept weight draws the last kept token, never past it; a row of NaN
    # log-probs gets an id in range and a NaN log-prob (its request alone fails).
    edge = torch.log_softmax(torch.tensor([[0.0, 3.0, 1.0, -math.inf], [0.0] * 4]), dim=-1)
    edge[1] = float("nan")
    rows = RowParams.build([SamplingParams(temperature=0.9)] * 2, [0, 0], [0, 0], 4, "cpu")
    rows = dataclasses.replace(rows, uniform=torch.tensor([1 - 2**-53, 0.5], dtype=torch.float64))
    edge_tokens, edge_logprobs = sample_rows(edge, rows, path=TRITON)
    torch_edge_tokens, _ = sample_rows(edge, rows, path=REFERENCE)
    return {
        "thresholds": thresholds,
        "compared": compared,
        "differ": differ,
        "hashed_differ": hashed_differ,
        "edge_tokens": edge_tokens.tolist(),
        "torch_edge_tokens": torch_edge_tokens.tolist(),
        "edge_logprobs": [None if math.isnan(x) else x for x in edge_logprobs.tolist()],
    }


def model() -> dict[str, object]:
    """A tiny model decoding through the fused body against the torch path: float32, to rounding; bfloat16,
    both against float32 (the fused body sums in float32 and rounds less often)."""
    errors = {}
    for same_length in (False, True):
        m = tiny_model(seed=24, mem_len=150, same_length=same_length, clamp_len=40)
        lengths = [0, 1, 3, 4, 5, 70, 200]
        got, expected = _decode_both_ways(m, lengths, mem_len=150, block_size=4, steps=2, path=TRITON)
        errors[f"float32 same_length={same_length}"] = float((got - expected).abs().max())
    lengths = [0, 3, 50]
    exact, _ = _decode_both_ways(
        tiny_model(seed=22, mem_len=40), lengths, mem_len=40, block_size=4, steps=2, path=REFERENCE
    )
    got, expected = _decode_both_ways(
        tiny_model(seed=22, mem_len=40).to(torch.bfloat16),
        lengths,
        mem_len=40,
        block_size=4,
        steps=2,
        path=TRITON,
    )
    return {
        "float32": errors,
        "bfloat16_fused_error": float((got.float() - exact).abs().mean()),
        "bfloat16_torch_error": float((expected.float() - exact).abs().mean()),
    }


def main() -> None:
    command = sys.argv[1]
    if command == "kernels":
        result = kernels(int(sys.argv[2]))
    elif command == "sampling":
        result = sampling()
    else:
        result = model()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
