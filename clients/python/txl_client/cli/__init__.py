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
    txl conversations new | show ID | items ID | say ID TEXT | rm ID...   conversations: a session and its items
    txl convert HF_DIR OUT_DIR               a downloaded transfo-xl-wt103 (HF) directory -> a TXL model directory
    txl tokenizer export DIR [--model M]     the model's tokenizer as a directory HF transformers loads

Exit status: 0 ok, 1 the server or the work failed, 2 usage error (bad flags, missing files), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from .._version import __version__
from ..errors import TxlError
from . import chat, conversations, local, memories, remote, sessions, tokenizer
from .connection import connection_flags
from .exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, UsageError, error_line


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["serve"]:  # everything after `serve` belongs to the server's own parser
        return local.serve(args_list[1:])
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


def build_parser() -> argparse.ArgumentParser:
    # Connection flags go before or after the command: `txl --url U sessions ls`, `txl sessions ls --url U`.
    connection = connection_flags()
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
    what = "list, show, start, fork, rewind and delete sessions"
    sessions.add_sessions(command("sessions", sessions.sessions_help, what), connection)
    what = "add, list, show and delete preloaded memories"
    memories.add_memories(command("memories", memories.memories_help, what), connection)
    what = "start, show, reply in and delete conversations"
    conversations.add_conversations(
        command("conversations", conversations.conversations_help, what), connection
    )
    local.add_convert(command("convert", local.convert, "convert a transfo-xl-wt103 HF directory"))
    tokenizer.add_tokenizer(
        command("tokenizer", tokenizer.tokenizer_help, "export the model's tokenizer for HF")
    )
    return parser
