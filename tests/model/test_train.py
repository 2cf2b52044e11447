"""The training loop on a tiny corpus: it learns, logs each held-out genre, resumes, exports, and starts from a model."""

from __future__ import annotations

import json

import pytest
import torch
import txl
from txl.training.train import TrainConfig, Trainer, parse_args, pick_device


def tiny_config(tmp_path, **overrides) -> TrainConfig:
    corpus = tmp_path / "corpus"
    (corpus / "valid").mkdir(parents=True, exist_ok=True)
    text = "The cat sat on the mat. The dog sat on the log. " * 200
    (corpus / "train.txt").write_text(text)
    (corpus / "valid" / "fiction.txt").write_text(text[:600])
    (corpus / "valid" / "technical.txt").write_text("x = 1\nprint(x)\n" * 40)
    fields = {
        "corpus": str(corpus),
        "out": str(tmp_path / "run"),
        "n_layer": 2,
        "d_model": 32,
        "n_head": 2,
        "d_head": 16,
        "d_inner": 64,
        "tgt_len": 16,
        "mem_len": 16,
        "batch_size": 4,
        "lr": 3e-3,
        "warmup_steps": 5,
        "max_steps": 60,
        "minutes": 10.0,
        "eval_interval": 20,
        "eval_bytes": 256,
        "checkpoint_interval": 20,
        "device": "cpu",
    }
    fields.update(overrides)
    return TrainConfig(**fields)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """20 steps, then a second run of the same config with a budget of 40 that resumes from the checkpoint."""
    tmp_path = tmp_path_factory.mktemp("train")
    Trainer(tiny_config(tmp_path, max_steps=20)).run()
    resumed = Trainer(tiny_config(tmp_path, max_steps=40))
    assert resumed.load_checkpoint()
    assert resumed.step == 20 and resumed.cursor == 20 * 16
    resumed.run()
    return tmp_path


def test_training_lowers_held_out_loss_per_genre_and_exports_a_servable_model(run_dir):
    records = [json.loads(line) for line in (run_dir / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [20, 40]
    assert set(records[-1]["valid_bpb_by_genre"]) == {"fiction", "technical"}
    assert records[-1]["valid_bpb_by_genre"]["fiction"] < 5.0  # random weights score 8 bits per byte
    model = txl.load_pretrained(run_dir / "run" / "model")
    assert model.config.n_layer == 2
    assert json.loads((run_dir / "run" / "model" / "config.json").read_text())["train_steps"] == 40


def test_init_from_starts_at_the_given_weights(run_dir):
    start = txl.load_pretrained(run_dir / "run" / "model")
    cfg = tiny_config(run_dir, out=str(run_dir / "next"), init_from=str(run_dir / "run" / "model"))
    trainer = Trainer(cfg)
    for name, tensor in start.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[name], tensor), name


def test_command_line_and_device_choice():
    cfg = parse_args(["--corpus", "c", "--n-layer", "3", "--no-bf16", "--device", "cpu", "--init-from", "m"])
    assert (cfg.corpus, cfg.n_layer, cfg.bf16, cfg.init_from) == ("c", 3, False, "m")
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
