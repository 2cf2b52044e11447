"""The paper's evaluation-speed comparison (Dai et al. 2019, Table 9), reproduced on this machine.

Transformer-XL evaluates a long text segment by segment, each query attending to a cached memory: the per-token
cost is one segment's forward over its 128 tokens. A vanilla Transformer with the same attention length must,
for every token, recompute its whole context window of L tokens. Same model shape (wt103-large), same weights,
same attention length L (txl: `mem_len` = L with `same_length`, so every query sees exactly L positions).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import txl
from txl.checkpoint import build_model
from txl_server.check.benchmark_docs import Section

from .common import timeit
from .model_vs_hf import SEGMENT, random_memory

PAPER = {800: 363, 1800: 773, 2800: 1409, 3800: 1874}


def wt103_model() -> txl.TransfoXLLMHeadModel:
    model = build_model(txl.TxlConfig.wt103())
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def xl_per_token(model: txl.TransfoXLLMHeadModel, length: int, repeat: int) -> tuple[float, float]:
    """(segment scoring, decode) seconds per token with a full memory of `length` positions."""
    segment = torch.randint(0, 20000, (1, SEGMENT))
    memory = random_memory(model, length, length)
    targets = torch.randint(0, 20000, (SEGMENT,))

    def score_segment():
        hidden, _ = model(segment, memory)
        model.target_log_probs(hidden[0], targets)

    state = {"memory": memory}
    token = torch.tensor([[7]])

    def decode():
        hidden, state["memory"] = model(token, state["memory"])
        model.target_log_probs(hidden[0], targets[:1])

    with torch.inference_mode():
        return timeit(score_segment, repeat=repeat) / SEGMENT, timeit(decode, repeat=repeat + 2, warmup=2)


def vanilla_per_token(model: txl.TransfoXLLMHeadModel, length: int, repeat: int) -> float:
    """Seconds to predict one token from scratch: a causal forward over the whole window of `length` tokens."""
    window = torch.randint(0, 20000, (1, length))
    target = torch.randint(0, 20000, (1,))
    model.config.same_length = False  # plain causal attention over the window
    try:

        def predict():
            hidden, _ = model(window, model.empty_memory(mem_len=0))
            model.target_log_probs(hidden[0, -1:], target)

        with torch.inference_mode():
            return timeit(predict, repeat=repeat, warmup=0)
    finally:
        model.config.same_length = True


def run(quick: bool = False) -> Section:
    section = Section(
        "paper",
        "Evaluation speed against a vanilla Transformer (the paper's Table 9)",
        "python -m bench paper",
    )
    section.note(__doc__.split("\n\n", 1)[1].strip())
    model = wt103_model()
    rows = []
    ratios = {}
    lengths = (800, 1800) if quick else tuple(PAPER)
    for length in lengths:
        xl_score, xl_decode = xl_per_token(model, length, repeat=2 if quick else 3)
        vanilla = vanilla_per_token(model, length, repeat=1 if quick else 2)
        ratios[length] = vanilla / xl_score
        rows.append(
            [
                length,
                vanilla * 1000,
                xl_score * 1000,
                vanilla / xl_score,
                PAPER[length],
                xl_decode * 1000,
                vanilla / xl_decode,
            ]
        )
    section.table(
        "Per-token cost, float32 (ms); slowdown = vanilla / Transformer-XL",
        [
            "attention length",
            "vanilla",
            "XL (segments of 128)",
            "slowdown",
            "paper",
            "XL (decode, 1 token)",
            "slowdown vs decode",
        ],
        rows,
    )
    section.note(
        "Target: at least the paper's slowdowns. The paper compares evaluation (scoring a corpus segment by segment); "
        "the decode column shows the stricter case of one token per step, which is bandwidth-bound on a CPU while "
        "the vanilla window is compute-bound."
    )
    _plot(ratios, section)
    return section


def _plot(ratios: dict[int, float], section: Section) -> None:
    if importlib.util.find_spec("matplotlib") is None:  # the `train` extra; without it, no figure
        return
    section.figure("paper_table9.png", lambda path: _draw(ratios, path))


def _draw(ratios: dict[int, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(list(PAPER), list(PAPER.values()), "o--", label="paper (GPU)")
    ax.plot(list(ratios), list(ratios.values()), "s-", label="txl (this CPU)")
    ax.set_xlabel("attention length")
    ax.set_ylabel("vanilla / Transformer-XL, per token")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
