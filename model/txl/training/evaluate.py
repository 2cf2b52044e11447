"""Held-out evaluation of a byte-level model: bits per byte per genre against memory length, next to `xz -9e`;
single-stream decode and scoring speed; samples.

    python -m txl.training.evaluate --model server/txl_server/default_model --corpus runs/corpus --out docs/default-model.json

Each held-out text (corpus/test/GENRE.txt, from scripts/prepare_corpus.py) is scored as one stream, segment by
segment, starting from an empty memory primed with "\\n" (as the server does), so every byte is predicted. `xz -9e`
(LZMA preset 9 + extreme) on the same bytes is the reference point a language model should beat. The validation
texts (what the training run watched) are scored at the serving memory only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import math
import shlex
import sys
import time
from pathlib import Path

import torch

from ..checkpoint import load_pretrained
from ..kernels import fastest
from ..model import TransfoXLLMHeadModel
from ..sampling import SamplingParams, make_generator, sample
from ..scoring import score_tokens
from ..tokenizers import ByteTokenizer

START = ord("\n")
PROMPT = "It was a dark and stormy night"  # the README's prompt


def bits_per_byte(model: TransfoXLLMHeadModel, data: bytes, *, mem_len: int, segment_len: int) -> float:
    path = fastest(model.device)  # the kernels this machine runs, as a server would
    result = score_tokens(model, [START, *data], mem_len=mem_len, segment_len=segment_len, path=path)
    return -result.logprob / math.log(2) / len(data)


def xz_bits_per_byte(data: bytes) -> float:
    return 8 * len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)) / len(data)


@torch.inference_mode()
def continue_text(
    model: TransfoXLLMHeadModel,
    prompt: str,
    *,
    tokens: int,
    temperature: float,
    seed: int,
    top_p: float = 1.0,
) -> str:
    tokenizer = ByteTokenizer()
    params = SamplingParams(temperature=temperature, top_p=top_p, seed=seed)
    generator, path = make_generator(seed), fastest(model.device)
    hidden, memory = model(
        torch.tensor([[START, *tokenizer.encode(prompt)]]), model.empty_memory(), path=path
    )
    decoder = tokenizer.decoder()
    out = []
    for _ in range(tokens):
        token, _ = sample(model.log_probs(hidden[0, -1], path), params, generator)
        out.append(decoder.push(token))
        before, (hidden, memory) = memory, model(torch.tensor([[token]]), memory, path=path)
        before.release()  # its blocks go back to the pool now
    memory.release()
    return "".join(out) + decoder.flush()


def sample_checks(text: str) -> dict[str, bool]:
    """The issue's bars for a sample: no tokenizer spacing, and no line that repeats an earlier one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return {
        "tokenizer_spacing": any(marker in text for marker in (" .", " ,", "``")),
        "repeated_line": len(lines) != len(set(lines)),
    }


@torch.inference_mode()
def decode_speed(model: TransfoXLLMHeadModel, data: bytes, *, steps: int) -> dict[str, float]:
    """Bytes per second of one stream decoding (step, log-probs, sample) after a full serving memory of context,
    per second of wall time and per second of this process's CPU time."""
    memory, path = model.empty_memory(), fastest(model.device)  # the kernels a server would run here
    hidden, memory = model(torch.tensor([list(data[: model.config.mem_len])]), memory, path=path)
    params, generator = SamplingParams(temperature=0.8, seed=0), make_generator(0)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        token, _ = sample(model.log_probs(hidden[0, -1], path), params, generator)
        before, (hidden, memory) = memory, model(torch.tensor([[token]]), memory, path=path)
        before.release()
    memory.release()
    return {
        "decode_bytes_per_s": steps / (time.perf_counter() - wall),
        "decode_bytes_per_cpu_s": steps / (time.process_time() - cpu),
    }


def score_speed(model: TransfoXLLMHeadModel, data: bytes) -> dict[str, float]:
    """Bytes per second of scoring one long document at the serving memory: per second of wall time, and per
    second of this process's CPU time (what the threads got on a machine that other work shares)."""
    wall, cpu = time.perf_counter(), time.process_time()
    bits_per_byte(model, data, mem_len=model.config.mem_len, segment_len=model.config.segment_len)
    return {
        "score_bytes_per_s": len(data) / (time.perf_counter() - wall),
        "score_bytes_per_cpu_s": len(data) / (time.process_time() - cpu),
    }


def held_out_row(
    model: TransfoXLLMHeadModel, data: bytes, mem_lens: list[int], slice_bytes: int
) -> dict[str, object]:
    segment = model.config.segment_len
    started = time.perf_counter()
    bpb = {str(m): bits_per_byte(model, data, mem_len=m, segment_len=segment) for m in mem_lens}
    head = data[:slice_bytes]
    return {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "xz_9e": xz_bits_per_byte(data),
        "bpb": bpb,
        "slice": {
            "bytes": len(head),
            "sha256": hashlib.sha256(head).hexdigest(),
            "mem_len": model.config.mem_len,
            "bpb": bits_per_byte(model, head, mem_len=model.config.mem_len, segment_len=segment),
        },
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, default=Path("runs/corpus"))
    parser.add_argument("--mem-lens", type=int, nargs="+", default=[0, 128, 512, 1024])
    parser.add_argument(
        "--slice-bytes",
        type=int,
        default=8192,
        help="the head of each test text that the test suite re-checks",
    )
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.6, 0.9])
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--sample-bytes", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--speed-threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=2, help="threads for the quality measurements")
    parser.add_argument(
        "--valid", action=argparse.BooleanOptionalAction, default=True, help="score the validation texts too"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    model = load_pretrained(args.model)
    serving = model.config.mem_len
    mem_lens = sorted(set(args.mem_lens) | {serving})
    report: dict = {
        "command": shlex.join(
            ["python", "-m", "txl.training.evaluate", *(sys.argv[1:] if argv is None else argv)]
        ),
        "model": str(args.model),
        "segment_len": model.config.segment_len,
        "serving_mem_len": serving,
        "same_length": model.config.same_length,
        "books": {},  # held-out test texts by genre (the name bench/quality.py reads)
        "valid": {},
    }
    torch.set_num_threads(args.threads)
    for path in sorted((args.corpus / "test").glob("*.txt")):
        row = {"split": "test", **held_out_row(model, path.read_bytes(), mem_lens, args.slice_bytes)}
        report["books"][path.stem] = row
        print(path.stem, json.dumps(row), flush=True)
    for path in sorted((args.corpus / "valid").glob("*.txt")) if args.valid else []:
        data = path.read_bytes()
        bpb = bits_per_byte(model, data, mem_len=serving, segment_len=model.config.segment_len)
        report["valid"][path.stem] = {"bytes": len(data), "xz_9e": xz_bits_per_byte(data), "bpb": bpb}
    text = (args.corpus / "test" / "fiction.txt").read_bytes()
    report["speed"] = {}
    for threads in args.speed_threads:
        torch.set_num_threads(threads)
        report["speed"][str(threads)] = {
            **decode_speed(model, text, steps=256),
            **score_speed(model, text[:32768]),
        }
        print(f"{threads} threads: {json.dumps(report['speed'][str(threads)])}", flush=True)
    torch.set_num_threads(args.threads)
    report["samples"] = []
    for temperature in args.temperatures:
        sample_text = continue_text(
            model, PROMPT, tokens=args.sample_bytes, temperature=temperature, seed=args.seed, top_p=args.top_p
        )
        report["samples"].append(
            {
                "prompt": PROMPT,
                "temperature": temperature,
                "top_p": args.top_p,
                "seed": args.seed,
                "text": sample_text,
                "checks": sample_checks(PROMPT + sample_text),
            }
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
