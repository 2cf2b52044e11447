"""Training a byte-level Transformer-XL the way the paper does (section 3.2 and appendix).

    python scripts/prepare_corpus.py --out runs/corpus
    python -m txl.training.train --corpus runs/corpus --out runs/books --minutes 60

Text is one long byte stream cut into `batch_size` parallel streams. Each step feeds the next `tgt_len` bytes
of every stream and carries the memory (detached hidden states of the last `mem_len` positions) to the next
step, so context flows across segments without backpropagating through them. Adam with linear warm-up and
cosine decay, gradient-norm clipping, periodic held-out evaluation (bits per byte), and checkpoints to resume
from. The model is the same `TransfoXLLMHeadModel` that serves: there is no second implementation.

Device-generic: `--device cuda` (or `auto`, the default, which takes a GPU when there is one) runs the same loop on a
GPU with bfloat16 autocast there too; the bundled model was trained on CPU, and the CUDA path is not tested here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoint import load_pretrained, save_pretrained
from ..config import TxlConfig
from ..kernels import fastest
from ..memory import HiddenMemory
from ..model import TransfoXLLMHeadModel
from ..scoring import score_tokens
from ..tokenizers import ByteTokenizer, save_tokenizer


@dataclass
class TrainConfig:
    # A corpus written by scripts/prepare_corpus.py: train.txt, and valid/GENRE.txt held out (never optimised on).
    corpus: str = "runs/corpus"
    out: str = "runs/books"
    init_from: str = ""  # a model directory to start from (same shape) instead of random weights
    device: str = "auto"  # auto: cuda when available, else cpu
    # Model shape (byte-level: 256 symbols, plain softmax).
    n_layer: int = 8
    d_model: int = 256
    n_head: int = 8
    d_head: int = 32
    d_inner: int = 1024
    # Regularisation matters little in about one epoch, and dropout's random masks cost a noticeable share of a CPU
    # step (docs/model.md).
    dropout: float = 0.0
    dropatt: float = 0.0
    clamp_len: int = 1024
    # Segments and memory as trained; evaluation and serving may use a longer memory.
    tgt_len: int = 128
    mem_len: int = 256
    batch_size: int = 16
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 300
    max_steps: int = 100000
    minutes: float = 60.0  # wall-clock budget; the schedule ends at whichever budget runs out first
    clip: float = 0.25
    weight_decay: float = 0.0
    eval_interval: int = 250
    eval_bytes: int = 16384  # from each held-out genre
    checkpoint_interval: int = 250
    # Autocast matmuls to bfloat16: several times the matmul rate on a CPU with avx512_bf16 (docs/model.md), and
    # tensor cores on a GPU.
    bf16: bool = True
    threads: int = 0  # 0: torch's default
    seed: int = 1234

    def model_config(self) -> TxlConfig:
        return TxlConfig(
            vocab_size=256,
            cutoffs=[],
            d_model=self.d_model,
            d_embed=self.d_model,
            n_head=self.n_head,
            d_head=self.d_head,
            d_inner=self.d_inner,
            div_val=1,
            n_layer=self.n_layer,
            mem_len=self.mem_len,
            clamp_len=self.clamp_len,
            same_length=False,
            tie_word_embeddings=True,
            dropout=self.dropout,
            dropatt=self.dropatt,
            tgt_len=self.tgt_len,
        )


# ---------------------------------------------------------------------------------------------- data


def read_bytes(path: Path, limit: int | None = None) -> torch.Tensor:
    """A file (its first `limit` bytes) as a uint8 tensor."""
    blob = path.read_bytes()[:limit]
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def held_out_sets(corpus: Path, split: str, limit: int) -> dict[str, torch.Tensor]:
    """genre -> the first `limit` bytes of corpus/SPLIT/GENRE.txt."""
    return {p.stem: read_bytes(p, limit) for p in sorted((corpus / split).glob("*.txt"))}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def batch_streams(data: torch.Tensor, batch_size: int) -> torch.Tensor:
    """[N] -> [B, N // B]: B contiguous streams read in parallel (the paper's LMOrderedIterator)."""
    n = data.numel() // batch_size
    return data[: n * batch_size].view(batch_size, n).long()


# ---------------------------------------------------------------------------------------------- training


def lr_at(step: int, progress: float, cfg: TrainConfig) -> float:
    """Linear warm-up over steps, then cosine decay over `progress` in [0, 1] of the run."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, max(0.0, progress))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def evaluate_bpb(model: TransfoXLLMHeadModel, data: torch.Tensor, *, mem_len: int, segment_len: int) -> float:
    """Bits per byte of `data` (every byte after the first), scored with a memory of `mem_len`."""
    was_training = model.training
    model.eval()
    path = fastest(model.device)  # the kernels this machine runs
    result = score_tokens(model, data.long(), mem_len=mem_len, segment_len=segment_len, path=path)
    model.train(was_training)
    return result.bits_per(result.scored)


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.seed)
        self.device = pick_device(cfg.device)
        corpus = Path(cfg.corpus)
        self.train_data = batch_streams(read_bytes(corpus / "train.txt"), cfg.batch_size).to(self.device)
        self.valid_data = held_out_sets(corpus, "valid", cfg.eval_bytes)
        if not self.valid_data:
            raise FileNotFoundError(f"no held-out text in {corpus / 'valid'}: run scripts/prepare_corpus.py")
        self.model = self.initial_model().to(self.device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.step = 0
        self.cursor = 0  # position in the streams
        self.elapsed = 0.0  # training seconds before this run (resumed)
        self.memory: HiddenMemory = self.model.empty_hidden_memory(cfg.batch_size)
        self.log_path = self.out / "log.jsonl"

    def initial_model(self) -> TransfoXLLMHeadModel:
        model = TransfoXLLMHeadModel(self.cfg.model_config())
        if not self.cfg.init_from:
            model.init_weights()
            return model
        # Continued training: the weights of an earlier model of the same shape, in float32 whatever they were saved as.
        start = load_pretrained(self.cfg.init_from, dtype=torch.float32)
        model.load_state_dict(start.state_dict())
        model.tie_weights()
        return model

    # -------------------------------------------------------------- checkpoints

    @property
    def checkpoint_path(self) -> Path:
        return self.out / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "cursor": self.cursor,
            "elapsed": self.elapsed,
            "memory": list(self.memory.hidden),
            "rng": torch.get_rng_state(),
            "train_config": json.dumps(dataclasses.asdict(self.cfg)),
        }
        tmp = self.checkpoint_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint_path)

    def load_checkpoint(self) -> bool:
        if not self.checkpoint_path.is_file():
            return False
        # weights_only: a checkpoint is data (tensors, numbers, strings), never code.
        state = torch.load(self.checkpoint_path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.model.tie_weights()
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.cursor, self.elapsed = state["step"], state["cursor"], state["elapsed"]
        self.memory = HiddenMemory(tuple(state["memory"]), self.cfg.mem_len, self.cfg.batch_size)
        torch.set_rng_state(state["rng"].cpu())
        return True

    # -------------------------------------------------------------- loop

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.cfg.tgt_len
        if self.cursor + t + 1 > self.train_data.size(1):  # epoch boundary: restart streams, forget memory
            self.cursor = 0
            self.memory = self.model.empty_hidden_memory(self.cfg.batch_size)
        window = self.train_data[:, self.cursor : self.cursor + t + 1]
        self.cursor += t
        return window[:, :-1], window[:, 1:]

    def progress(self) -> float:
        """Fraction of the run done: of the step budget or of the time budget, whichever is further along.

        The time budget makes the schedule finish on time on a shared, noisy machine whatever the step rate.
        """
        return max(self.step / self.cfg.max_steps, self.elapsed / (self.cfg.minutes * 60))

    def train_step(self) -> float:
        inputs, targets = self.next_batch()
        lr = lr_at(self.step, self.progress(), self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16):
            hidden, self.memory = self.model(inputs, self.memory)
            loss = -self.model.target_log_probs(hidden, targets).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        self.optimizer.step()
        self.step += 1
        return float(loss.detach()) / math.log(2)

    def log(self, record: dict) -> None:
        with self.log_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)

    def run(self) -> None:
        cfg = self.cfg
        resumed = self.load_checkpoint()
        print(
            f"{'resumed at step ' + str(self.step) if resumed else 'training'}: {self.model.config}",
            flush=True,
        )
        start = time.perf_counter() - self.elapsed
        recent: list[float] = []
        while self.progress() < 1.0:
            recent.append(self.train_step())
            self.elapsed = time.perf_counter() - start
            done = self.progress() >= 1.0
            if self.step % cfg.eval_interval == 0 or done:
                val = {
                    genre: evaluate_bpb(self.model, data, mem_len=cfg.mem_len, segment_len=cfg.tgt_len)
                    for genre, data in self.valid_data.items()
                }
                self.log(
                    {
                        "step": self.step,
                        "train_bpb": sum(recent) / len(recent),
                        "valid_bpb": sum(val.values()) / len(val),  # the mean over held-out genres
                        "valid_bpb_by_genre": val,
                        "lr": lr_at(self.step, self.progress(), cfg),
                        "elapsed_s": round(self.elapsed, 1),
                    }
                )
                recent = []
            if self.step % cfg.checkpoint_interval == 0:
                self.save_checkpoint()
        self.save_checkpoint()
        self.export(self.out / "model")

    def export(self, model_dir: Path) -> None:
        self.model.eval()
        save_pretrained(
            self.model,
            model_dir,
            extra_config={
                "train_mem_len": self.cfg.mem_len,
                "train_steps": self.step,
                "init_from": self.cfg.init_from or None,
            },
        )
        save_tokenizer(ByteTokenizer(), model_dir)
        print(f"saved {model_dir}", flush=True)


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for f in dataclasses.fields(TrainConfig):
        kind = (
            f.type
            if isinstance(f.type, type)
            else {"int": int, "float": float, "str": str, "bool": bool}[str(f.type)]
        )
        if kind is bool:
            parser.add_argument(
                f"--{f.name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=None
            )
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=None)
    args = vars(parser.parse_args(argv))
    overrides = {k: v for k, v in args.items() if v is not None}
    return TrainConfig(**overrides)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    Trainer(cfg).run()


if __name__ == "__main__":
    main()
