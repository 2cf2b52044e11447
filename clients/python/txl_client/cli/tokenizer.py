"""`txl tokenizer export DIR`: the served model's tokenizer as a directory HF transformers loads
(`AutoTokenizer.from_pretrained(DIR)`), for tools that tokenize locally (AIPerf, GuideLLM, lm-eval's
`huggingface` backend). It runs here, not against a server, and needs the txl-serve distribution (imported only
when it runs): the model directory and the limits are the server's own settings (`--model`, TXL_* variables)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .exits import EXIT_FAILED, UsageError
from .local import INSTALL_HINT

# What an export may write: a byte-level tokenizer's files, or a word-level one's.
EXPORTED_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")


def add_tokenizer(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(title="actions", metavar="ACTION")
    export = actions.add_parser(
        "export",
        help="write the model's tokenizer as an HF tokenizer directory",
        description="Write the tokenizer of a model directory (default: TXL_MODEL, else the bundled model) as a "
        "directory that HF transformers' AutoTokenizer.from_pretrained(DIR) loads and that encodes text as the "
        "server does: a fast tokenizer for byte-level models, HF's TransfoXLTokenizer (vocab.txt) for word-level "
        "ones. model_max_length is TXL_MAX_TEXT_CHARS; the chat template is the server's (TXL_CHAT_TEMPLATE, else "
        "the model's own), in Jinja.",
    )
    export.add_argument("out_dir", metavar="DIR", type=Path, help="where to write the tokenizer directory")
    export.add_argument(
        "--model", type=Path, help="the model directory (default: TXL_MODEL, else the bundled one)"
    )
    export.add_argument("--force", action="store_true", help="overwrite tokenizer files already in DIR")
    export.set_defaults(run=export_tokenizer)


def tokenizer_help(args: argparse.Namespace) -> int:
    raise UsageError("give an action: txl tokenizer export DIR")


def export_tokenizer(args: argparse.Namespace) -> int:
    existing = [name for name in EXPORTED_FILES if (args.out_dir / name).exists()]
    if existing and not args.force:
        raise UsageError(f"{args.out_dir} already has {', '.join(existing)}; use --force to overwrite")
    if args.model is not None and not args.model.is_dir():
        raise UsageError(f"{args.model} is not a directory")
    try:
        from pydantic import ValidationError
        from txl.tokenizers import TokenizerError, load_tokenizer
        from txl.tokenizers.hf_export import export_hf_tokenizer
        from txl_server.api.shared.chat_template import ChatTemplate, served_settings
        from txl_server.settings import BUNDLED_MODEL_DIR, Settings
    except ModuleNotFoundError as exc:
        print(
            f"txl tokenizer: the TXL server is not installed (no module {exc.name!r}); {INSTALL_HINT}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:
        settings = served_settings(Settings(**({"model": args.model} if args.model is not None else {})))
    except ValidationError as exc:
        raise UsageError(f"the server's settings (TXL_* variables) are invalid: {exc}") from None
    except ValueError as exc:  # the model directory's chat_template.json
        raise UsageError(str(exc)) from None
    model_dir = settings.model or BUNDLED_MODEL_DIR
    template = ChatTemplate(settings.chat_template).jinja() if settings.chat_template is not None else None
    try:
        tokenizer = load_tokenizer(model_dir)
        for name in EXPORTED_FILES:  # an export replaces the previous one whole (a byte one has no vocab.txt)
            (args.out_dir / name).unlink(missing_ok=True)
        written = export_hf_tokenizer(
            tokenizer, args.out_dir, model_max_length=settings.max_text_chars, chat_template=template
        )
    except (TokenizerError, OSError) as exc:
        print(f"txl tokenizer: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {args.out_dir}: {', '.join(p.name for p in written)} (the tokenizer of {model_dir})")
    return 0
