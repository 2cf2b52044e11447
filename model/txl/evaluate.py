"""Held-out evaluation of a byte-level model: bits per byte against memory length, next to `xz -9e`.

    python -m txl.evaluate --model server/txl_server/default_model --out docs/default-model.json

Each held-out book is scored as one stream, segment by segment, starting from an empty memory primed with "\\n"
(as the server does), so every byte is predicted. `xz -9e` (LZMA preset 9 + extreme) on the same bytes is the
reference point a language model should beat.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import time
from pathlib import Path

import torch

from .checkpoint import load_pretrained
from .model import TransfoXLLMHeadModel
from .sampling import SamplingParams, make_generator, sample
from .scoring import score_tokens
from .tokenizers import ByteTokenizer
from .train import TEST_BOOKS, VALID_BOOKS

START = ord("\n")


def bits_per_byte(model: TransfoXLLMHeadModel, data: bytes, *, mem_len: int, segment_len: int) -> float:
    result = score_tokens(model, [START, *data], mem_len=mem_len, segment_len=segment_len)
    return -result.logprob / math.log(2) / len(data)


def xz_bits_per_byte(data: bytes) -> float:
    return 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(data)


@torch.inference_mode()
def continue_text(
    model: TransfoXLLMHeadModel, prompt: str, *, tokens: int, temperature: float, seed: int
) -> str:
    tokenizer = ByteTokenizer()
    params = SamplingParams(temperature=temperature, seed=seed)
    generator = make_generator(seed)
    hidden, memory = model(torch.tensor([[START, *tokenizer.encode(prompt)]]), model.empty_memory())
    decoder = tokenizer.decoder()
    out = []
    for _ in range(tokens):
        token, _ = sample(model.log_probs(hidden[0, -1]), params, generator)
        out.append(decoder.push(token))
        hidden, memory = model(torch.tensor([[token]]), memory)
    return "".join(out) + decoder.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--mem-lens", type=int, nargs="+", default=[0, 128, 512, 1024])
    parser.add_argument(
        "--slice-bytes", type=int, default=16384, help="a short slice the test suite re-checks"
    )
    parser.add_argument(
        "--same-length",
        choices=["config", "true", "false"],
        default="config",
        help="override the model's same_length",
    )
    parser.add_argument("--books", nargs="*", default=None, help="only these held-out books (file names)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_pretrained(args.model)
    if args.same_length != "config":
        model.config.same_length = args.same_length == "true"
    segment = model.config.segment_len
    serving = model.config.mem_len
    report: dict = {
        "model": str(args.model),
        "segment_len": segment,
        "serving_mem_len": serving,
        "same_length": model.config.same_length,
        "books": {},
    }
    for split, names in (("valid", VALID_BOOKS), ("test", TEST_BOOKS)):
        for name in names:
            if args.books is not None and name not in args.books:
                continue
            data = (args.data_dir / "gutenberg" / name).read_bytes()
            started = time.perf_counter()
            row: dict = {"split": split, "bytes": len(data), "xz_9e": xz_bits_per_byte(data), "bpb": {}}
            for mem_len in sorted(set(args.mem_lens) | {serving}):
                row["bpb"][str(mem_len)] = bits_per_byte(model, data, mem_len=mem_len, segment_len=segment)
                print(f"{name} mem_len {mem_len}: {row['bpb'][str(mem_len)]:.4f} bits/byte", flush=True)
            row["slice"] = {
                "bytes": args.slice_bytes,
                "mem_len": serving,
                "bpb": bits_per_byte(model, data[: args.slice_bytes], mem_len=serving, segment_len=segment),
            }
            row["seconds"] = round(time.perf_counter() - started, 1)
            report["books"][name] = row
    report["sample"] = {
        "prompt": "It was a dark and stormy night",
        "temperature": 0.8,
        "seed": 1,
        "text": continue_text(model, "It was a dark and stormy night", tokens=400, temperature=0.8, seed=1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
