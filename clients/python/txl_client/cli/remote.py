"""`txl generate` and `txl score`: the commands that stream a server's work to the terminal."""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any, TextIO

from ..errors import TxlError
from ..types import ScoreResult
from .connection import make_client
from .documents import read_document
from .exits import EXIT_FAILED, UsageError, error_line
from .progress import ProgressBar, add_progress, shows_progress
from .sampling import add_sampling, sampling_kwargs

# ---------------------------------------------------------------------------------------------- generate


def add_generate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", nargs="?", default="", help='text to continue ("-": read standard input)')
    parser.add_argument("--session", metavar="ID", help="continue this session (default: a new one)")
    parser.add_argument("--rm", action="store_true", help="delete the new session afterwards")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (no streamed text)")
    add_progress(parser, "how far the server is in reading a long prompt")
    add_sampling(parser, max_tokens=300)


def generate(args: argparse.Namespace) -> int:
    """Always streams, also for --json: a long prompt then reports its progress, which keeps the request from
    timing out while the server is busy reading it."""
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt and not args.session:
        raise UsageError("give a prompt, or --session ID to continue a session")
    with make_client(args) as client:
        session_id = args.session or client.create_session().id
        bar = ProgressBar("prompt", sys.stderr) if shows_progress(args) else None
        try:
            stream = client.generate(
                session_id,
                prompt,
                stream=True,
                on_progress=bar.update if bar else None,
                **sampling_kwargs(args),
            )
            with stream:
                for token in stream:
                    if bar is not None:  # the prompt is in: the bar gives way to the text
                        bar.clear()
                        bar = None
                    if not args.json:
                        sys.stdout.write(token.text)
                        sys.stdout.flush()
            result = stream.finish()
            if bar is not None:
                bar.clear()
            if args.json:
                print(result.model_dump_json(indent=2))
                return 0
            if not result.text.endswith("\n"):
                sys.stdout.write("\n")
            sys.stdout.flush()
            if not args.rm:
                print(
                    f"session {session_id} (version {result.session.version}, {result.session.tokens} tokens, "
                    f"finish: {result.finish_reason})",
                    file=sys.stderr,
                )
        finally:
            if args.rm and not args.session:
                client.delete_session(session_id)
    return 0


# ---------------------------------------------------------------------------------------------- score


def add_score(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", metavar="FILE", nargs="+", type=Path, help='UTF-8 text files ("-": standard input)'
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per file")
    add_progress(parser, "progress")


def score(args: argparse.Namespace) -> int:
    """Prints each file's result as soon as it has it (whatever stdout is: a file, a pipe), so that a failure on
    a later file loses nothing already scored; --json's list is closed even then."""
    documents = [
        (str(path), read_document(path)) for path in args.files
    ]  # every file readable before any work
    show_progress = shows_progress(args)
    output = JsonList(sys.stdout) if args.json else ScoreTable(sys.stdout)
    try:
        with make_client(args) as client:
            for name, text in documents:
                bar = ProgressBar(name, sys.stderr) if show_progress else None
                try:
                    result = client.score(text, on_progress=bar.update if bar else None)
                except TxlError as exc:
                    print(error_line(exc, name), file=sys.stderr)
                    return EXIT_FAILED
                finally:
                    if bar:
                        bar.clear()
                output.add(name, result)
        output.complete()
    finally:
        output.close()
    return 0


class ScoreTable:
    """Rows as they come, then a total row for several files."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.rows: list[ScoreResult] = []
        self._write(f"{'tokens':>10} {'bytes':>10} {'perplexity':>12} {'bits/byte':>10}  file")

    def add(self, name: str, r: ScoreResult) -> None:
        self.rows.append(r)
        self._write(f"{r.tokens:>10} {r.bytes:>10} {r.perplexity:>12.4f} {r.bits_per_byte:>10.4f}  {name}")

    def complete(self) -> None:
        """Every file is in: the total, for several."""
        if len(self.rows) < 2:
            return
        tokens = sum(r.tokens for r in self.rows)
        size = sum(r.bytes for r in self.rows)
        logprob = sum(r.logprob for r in self.rows)
        perplexity = math.exp(-logprob / tokens) if tokens else float("nan")
        bpb = -logprob / math.log(2) / size if size else float("nan")
        self._write(f"{tokens:>10} {size:>10} {perplexity:>12.4f} {bpb:>10.4f}  total")

    def close(self) -> None:
        pass

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


class JsonList:
    """A JSON list written one object at a time, and closed whatever happens: valid JSON even after a failure."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.count = stream, 0
        self.stream.write("[")

    def add(self, name: str, result: ScoreResult) -> None:
        item = textwrap.indent(json.dumps({"file": name, **_score_fields(result)}, indent=2), "  ")
        self.stream.write(("," if self.count else "") + "\n" + item)
        self.stream.flush()
        self.count += 1

    def complete(self) -> None:
        pass

    def close(self) -> None:
        self.stream.write("\n]\n" if self.count else "]\n")
        self.stream.flush()


def _score_fields(result: ScoreResult) -> dict[str, Any]:
    keys = ("tokens", "bytes", "logprob", "nll", "perplexity", "bits_per_byte")
    return {k: getattr(result, k) for k in keys}
