"""Packs a trained run as the bundled default model: float16 weights (under 25 MB), serving lengths in config.json.

python scripts/bundle_default_model.py runs/books-v2/model --mem-len 512 --same-length false
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from txl import load_pretrained, save_pretrained
from txl.tokenizers import ByteTokenizer, save_tokenizer

TARGET = Path(__file__).resolve().parents[1] / "server" / "txl_server" / "default_model"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_model", type=Path, help="the model directory a training run exported")
    parser.add_argument("--mem-len", type=int, required=True, help="memory length to serve with")
    parser.add_argument("--same-length", choices=["true", "false"], required=True)
    parser.add_argument("--out", type=Path, default=TARGET)
    args = parser.parse_args()
    model = load_pretrained(args.run_model)
    config = model.config
    trained_mem_len = config.mem_len
    config.mem_len = args.mem_len
    config.same_length = args.same_length == "true"
    config.dropout = 0.0
    if args.out.exists():
        shutil.rmtree(args.out)
    # float16 keeps 11 significant bits (enough for inference; measured on the held-out books) and halves the size.
    save_pretrained(
        model.to(torch.float16),
        args.out,
        extra_config={
            "train_mem_len": trained_mem_len,
            "serve_mem_len": args.mem_len,
            "train_tgt_len": config.tgt_len,
        },
    )
    save_tokenizer(ByteTokenizer(), args.out)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"wrote {args.out} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
