"""Commands that run here, not against a server: `txl serve` and `txl convert`.

Both need the txl-serve distribution (the server and the `txl` model library), imported only when they run,
so the client stays light: httpx and pydantic.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .exits import EXIT_FAILED, UsageError

INSTALL_HINT = "install the server with `pip install 'txl-serve[server]'` (or `bash scripts/install.sh`)"


def serve(argv: list[str]) -> int:
    """`python -m txl_server` with the same flags and TXL_* environment variables."""
    try:
        from txl_server.__main__ import main as server_main
    except ModuleNotFoundError as exc:
        print(
            f"txl serve: the TXL server is not installed (no module {exc.name!r}); {INSTALL_HINT}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:
        status: int = server_main(argv, prog="txl serve")
        return status
    except ModuleNotFoundError as exc:  # the server is there but one of its extras is not
        print(f"txl serve: missing module {exc.name!r}; {INSTALL_HINT}", file=sys.stderr)
        return EXIT_FAILED


# ---------------------------------------------------------------------------------------------- convert

OUTPUT_FILES = ("config.json", "model.safetensors", "tokenizer.json")
VOCAB_FILES = ("vocab.pkl", "vocab.bin")


def add_convert(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Convert a downloaded transfo-xl-wt103 directory in HF's format (config.json, pytorch_model.bin or "
        "model.safetensors, vocab.pkl, and tokenizer_config.json or added_tokens.json where HF saved them) to a "
        "TXL model directory (config.json, model.safetensors, tokenizer.json) that `txl serve --model OUT_DIR` "
        "serves. The tokenizer encodes as HF transformers 4.35.2 does, added-token table included. Pickles are "
        "never executed: weights are read weights-only and the vocabulary with a restricted unpickler."
    )
    parser.add_argument("hf_dir", metavar="HF_DIR", type=Path, help="the HF model directory")
    parser.add_argument(
        "out_dir", metavar="OUT_DIR", type=Path, help="where to write the TXL model directory"
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="weights dtype (default float32)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite files already in OUT_DIR")


def convert(args: argparse.Namespace) -> int:
    hf_dir, out_dir = args.hf_dir, args.out_dir
    if not hf_dir.is_dir():
        raise UsageError(f"{hf_dir} is not a directory")
    vocab = next((hf_dir / name for name in VOCAB_FILES if (hf_dir / name).is_file()), None)
    if vocab is None:
        raise UsageError(f"no {' or '.join(VOCAB_FILES)} in {hf_dir}: is it a transfo-xl HF directory?")
    if out_dir.resolve() == hf_dir.resolve():
        raise UsageError("OUT_DIR must differ from HF_DIR")
    existing = [name for name in OUTPUT_FILES if (out_dir / name).exists()]
    if existing and not args.force:
        raise UsageError(f"{out_dir} already has {', '.join(existing)}; use --force to overwrite")
    try:  # imported only now: the arguments are checked in a blink, torch takes seconds to load
        import txl
        from txl.tokenizers import TokenizerError, load_tokenizer
        from txl.tokenizers.vocab_pickle import VocabFileError
        from txl.tokenizers.word import convert_hf_vocab
    except ModuleNotFoundError as exc:
        print(
            f"txl convert: the txl model library is not installed (no module {exc.name!r}); {INSTALL_HINT}",
            file=sys.stderr,
        )
        return EXIT_FAILED

    print(f"reading {hf_dir} ...", file=sys.stderr)
    try:
        model = txl.load_pretrained(hf_dir, dtype=args.dtype)  # strict: every tensor present and of its shape
    except (txl.CheckpointError, ValueError) as exc:
        print(f"txl convert: {exc}", file=sys.stderr)
        return EXIT_FAILED
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    try:
        written.append(convert_hf_vocab(vocab, out_dir))
        tokenizer = load_tokenizer(out_dir)
        if tokenizer.vocab_size != model.config.vocab_size:
            raise ValueError(
                f"{vocab.name} has {tokenizer.vocab_size} symbols but the model {model.config.vocab_size}"
            )
        txl.save_pretrained(model, out_dir)
        written += [out_dir / "config.json", out_dir / "model.safetensors"]
    except (VocabFileError, TokenizerError, ValueError, OSError) as exc:
        for path in written:  # leave no half-converted directory behind
            path.unlink(missing_ok=True)
        print(f"txl convert: {exc}", file=sys.stderr)
        return EXIT_FAILED
    parameters = sum(p.numel() for p in model.parameters())
    added = len(getattr(tokenizer, "added_tokens", ()))  # entries of HF's table that change an encoding
    table = f", {added} added token{'s' * (added != 1)} from HF's table" if added else ""
    print(
        f"wrote {out_dir}: {', '.join(OUTPUT_FILES)} ({parameters:,} parameters, {args.dtype}, "
        f"vocabulary of {tokenizer.vocab_size:,}{table})"
    )
    print(f"serve it with: txl serve --model {out_dir}", file=sys.stderr)
    return 0
