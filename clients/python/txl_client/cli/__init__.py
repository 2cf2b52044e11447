"""`txl`: the command line of TXL Serve.

    txl serve [server flags]                 start a server (same flags and TXL_* variables as python -m txl_server)
    txl generate "prompt" [--session ID]     stream a continuation to the terminal
    txl chat [--session ID]                  an interactive loop on one session (/fork /reset /info /quit)
    txl score FILE... [--json]               tokens, perplexity and bits per byte of each file
    txl sessions ls | show ID | rm ID...     your sessions
    txl sessions new [TEXT] [--memory ID]    start a session (from a preloaded memory), print its id
    txl sessions history ID | rewind ID N    the versions a session keeps; continue from one of them
    txl sessions fork ID [--version N]       a new session from a session (or one of its versions), print its id
    txl memories add FILE | ls | show ID | rm ID...   preloaded memories: documents read once
    txl convert HF_DIR OUT_DIR               a downloaded transfo-xl-wt103 (HF) directory -> a TXL model directory

Exit status: 0 ok, 1 the server or the work failed, 2 usage error (bad flags, missing files), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TypedDict

from .._version import __version__
from ..client import Client
from ..errors import TxlError, TxlTimeoutError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """A problem with what the user asked for (exit status 2), found after argument parsing."""


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["serve"]:  # everything after `serve` belongs to the server's own parser
        from .local import serve

        return serve(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        status: int = args.run(args)
        return status
    except UsageError as exc:
        print(f"txl: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TxlError as exc:
        print(error_line(exc), file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `txl generate ... | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED


def error_line(exc: TxlError, where: str = "") -> str:
    """`txl: error: [where: ]<the error>`, with a hint where one helps."""
    hint = " (wait longer with --timeout SECONDS)" if isinstance(exc, TxlTimeoutError) else ""
    return f"txl: error: {where + ': ' if where else ''}{exc}{hint}"


def make_client(args: argparse.Namespace) -> Client:
    # The connection flags have no defaults in the namespace (argparse.SUPPRESS), so that a flag given before
    # the command is not overwritten by the command's own parser; unset means "the environment, else default".
    return Client(
        getattr(args, "url", None), getattr(args, "api_key", None), timeout=getattr(args, "timeout", 60.0)
    )


def build_parser() -> argparse.ArgumentParser:
    from . import chat, history, local, memories, remote

    # Connection flags go before or after the command: `txl --url U sessions ls`, `txl sessions ls --url U`.
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument(
        "--url", default=argparse.SUPPRESS, help="server URL (TXL_URL, default http://127.0.0.1:8000)"
    )
    connection.add_argument("--api-key", default=argparse.SUPPRESS, help="API key (TXL_API_KEY)")
    connection.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS,
        help="seconds to wait for the server to answer or report progress (default 60)",
    )

    parser = argparse.ArgumentParser(
        prog="txl",
        description="TXL Serve: stateful Transformer-XL inference. Client commands talk to a server at --url.",
        parents=[connection],
    )
    parser.add_argument("--version", action="version", version=f"txl {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, parents=[connection])
        sub.set_defaults(run=run)
        return sub

    commands.add_parser(
        "serve", help="start a server (flags: see `txl serve --help`)", add_help=False
    )  # dispatched before parsing, in main()
    remote.add_generate(command("generate", remote.generate, "generate a continuation, streamed"))
    chat.add_chat(command("chat", chat.chat, "chat on one session: lines are added, continuations streamed"))
    remote.add_score(command("score", remote.score, "perplexity and bits per byte of text files"))
    sessions = command(
        "sessions", remote.sessions_help, "list, show, start, fork, rewind and delete sessions"
    )
    actions = sessions.add_subparsers(title="actions", metavar="ACTION")
    ls = actions.add_parser("ls", help="list sessions", parents=[connection])
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(run=remote.sessions_ls)
    show = actions.add_parser("show", help="show one session as JSON", parents=[connection])
    show.add_argument("session_id", metavar="ID")
    show.set_defaults(run=remote.sessions_show)
    rm = actions.add_parser("rm", help="delete sessions", parents=[connection])
    rm.add_argument("session_ids", metavar="ID", nargs="+")
    rm.set_defaults(run=remote.sessions_rm)
    new = actions.add_parser("new", help="start a session (--memory ID: from a memory)", parents=[connection])
    memories.add_session_new(new)
    history.add_history(actions, connection)
    what = "add, list, show and delete preloaded memories"
    memories.add_memories(command("memories", memories.memories_help, what), connection)
    local.add_convert(command("convert", local.convert, "convert a transfo-xl-wt103 HF directory"))
    return parser


def add_sampling(parser: argparse.ArgumentParser, *, max_tokens: int) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument(
        "--max-tokens",
        type=_non_negative,
        default=max_tokens,
        help=f"tokens to generate (default {max_tokens})",
    )
    # 0.8 with top-p 0.95 reads best with the bundled byte model (docs/default-model.md): lower loops on phrases,
    # 1.0 untruncated drifts into made-up words.
    group.add_argument("--temperature", type=float, default=0.8, help="0: greedy (default 0.8)")
    group.add_argument("--top-k", type=_non_negative, help="keep the k likeliest tokens (0: all)")
    group.add_argument(
        "--top-p", type=float, default=0.95, help="nucleus sampling mass, in (0, 1] (default 0.95)"
    )
    group.add_argument("--seed", type=_non_negative, help="for reproducible sampling")
    group.add_argument("--stop", action="append", help="stop before this string (repeatable)")


class Sampling(TypedDict):
    max_tokens: int | None
    temperature: float | None
    top_k: int | None
    top_p: float | None
    seed: int | None
    stop: list[str] | None


def sampling_kwargs(args: argparse.Namespace) -> Sampling:
    return {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "stop": args.stop,
    }


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value}")
    return number
