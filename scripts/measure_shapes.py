"""What a model shape costs on this machine: size on disk, training step, single-stream decode and scoring speed.

    python scripts/measure_shapes.py 6x256x8x1024 8x256x8x1024 10x320x8x1280 12x384x8x1536 --out docs/default-model-shapes.json

A shape is LAYERSxD_MODELxHEADSxD_INNER (byte vocabulary, tied embeddings). Weights are random: speed does not
depend on them. Rates are given per second of wall time and per second of this process's CPU time, since other work
may share the machine; one thread unless --threads says otherwise.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from txl.model import TransfoXLLMHeadModel
from txl.training.evaluate import decode_speed, score_speed
from txl.training.train import TrainConfig


def train_step_seconds(cfg: TrainConfig, steps: int) -> dict[str, float]:
    """Median wall and CPU seconds of a bfloat16-autocast training step (16 streams x 128 bytes, memory 256)."""
    model = TransfoXLLMHeadModel(cfg.model_config())
    model.init_weights()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    memory = model.empty_hidden_memory(cfg.batch_size)
    data = torch.randint(0, 256, (cfg.batch_size, cfg.tgt_len + 1))
    walls, cpus = [], []
    for _ in range(steps + 1):  # the first step warms up the allocator and kernels
        wall, cpu = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden, memory = model(data[:, :-1], memory)
            loss = -model.target_log_probs(hidden, data[:, 1:]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"train_step_s": sorted(walls[1:])[steps // 2], "train_step_cpu_s": sorted(cpus[1:])[steps // 2]}


def measure(shape: str, *, steps: int, mem_len: int) -> dict[str, object]:
    layers, d_model, heads, d_inner = (int(x) for x in shape.split("x"))
    cfg = TrainConfig(n_layer=layers, d_model=d_model, n_head=heads, d_head=d_model // heads, d_inner=d_inner)
    model = TransfoXLLMHeadModel(cfg.model_config())
    model.init_weights()
    params = sum(p.numel() for p in model.parameters())
    model.eval()
    model.config.mem_len = mem_len
    text = bytes(torch.randint(32, 127, (32768,), generator=torch.Generator().manual_seed(0)).tolist())
    return {
        "params": params,
        "float16_mb": 2 * params / 1e6,
        **train_step_seconds(cfg, steps),
        **decode_speed(model, text, steps=128),
        **score_speed(model, text[:16384]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--mem-len", type=int, default=512, help="serving memory for decode and scoring")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report = {"threads": args.threads, "mem_len": args.mem_len, "shapes": {}}
    for shape in args.shapes:
        report["shapes"][shape] = measure(shape, steps=args.steps, mem_len=args.mem_len)
        print(shape, json.dumps(report["shapes"][shape]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
