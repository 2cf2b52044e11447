"""The sampling flags of `txl generate` and `txl chat`, and the SDK arguments they become."""

from __future__ import annotations

import argparse

from ..operations import Sampling


def add_sampling(parser: argparse.ArgumentParser, *, max_tokens: int) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument(
        "--max-tokens",
        type=non_negative,
        default=max_tokens,
        help=f"tokens to generate (default {max_tokens})",
    )
    # 0.8 with top-p 0.95 reads best with the bundled byte model (docs/default-model.md): lower loops on phrases,
    # 1.0 untruncated drifts into made-up words.
    group.add_argument("--temperature", type=float, default=0.8, help="0: greedy (default 0.8)")
    group.add_argument("--top-k", type=non_negative, help="keep the k likeliest tokens (0: all)")
    group.add_argument(
        "--top-p", type=float, default=0.95, help="nucleus sampling mass, in (0, 1] (default 0.95)"
    )
    group.add_argument("--seed", type=non_negative, help="for reproducible sampling")
    group.add_argument("--stop", action="append", help="stop before this string (repeatable)")


def sampling_kwargs(args: argparse.Namespace) -> Sampling:
    """The flags as `generate`'s keyword arguments."""
    return {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "stop": args.stop,
    }


def non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value}")
    return number
