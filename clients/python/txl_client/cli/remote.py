"""`txl generate` and `txl score`: the commands that stream a server's work to the terminal."""

from __future__ import annotations

import argparse
import json
import lzma
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
from .waiting import Waiting

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
        shown = shows_progress(args)
        bar = ProgressBar("prompt", sys.stderr) if shown else None
        # Until the server sends anything: how long, and what else it runs (a token may wait beside long work).
        waiting = Waiting(client, sys.stderr).start() if shown else None

        def progress(done: int, total: int) -> None:
            if waiting is not None:
                waiting.stop()
            if bar is not None:
                bar.update(done, total)

        try:
            stream = client.generate(
                session_id,
                prompt,
                stream=True,
                on_progress=progress if shown else None,
                **sampling_kwargs(args),
            )
            with stream:
                for token in stream:
                    if waiting is not None:
                        waiting.stop()
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
            if waiting is not None:
                waiting.stop()
            if args.rm and not args.session:
                client.delete_session(session_id)
    return 0


# ---------------------------------------------------------------------------------------------- score


def add_score(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", metavar="FILE", nargs="+", type=Path, help='UTF-8 text files ("-": standard input)'
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per file")
    parser.add_argument(
        "--xz",
        action="store_true",
        help="also compress each file with xz -9e (here, with Python's lzma) and compare: the model's bits per "
        "byte against xz's, and how much smaller the model's code would be",
    )
    add_progress(parser, "progress")


def score(args: argparse.Namespace) -> int:
    """Prints each file's result as soon as it has it (whatever stdout is: a file, a pipe), so that a failure on
    a later file loses nothing already scored; --json's list is closed even then."""
    documents = [
        (str(path), read_document(path)) for path in args.files
    ]  # every file readable before any work
    show_progress = shows_progress(args)
    output = JsonList(sys.stdout, xz=args.xz) if args.json else ScoreTable(sys.stdout, xz=args.xz)
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
                output.add(name, result, xz_bits(text) if args.xz else None)
        output.complete()
    finally:
        output.close()
    return 0


class ScoreTable:
    """Rows as they come (the header with the first), then a total row for several files; with `xz`, each file's
    bits per byte under `xz -9e` beside the model's, and the model's difference to it."""

    def __init__(self, stream: TextIO, *, xz: bool = False) -> None:
        self.stream, self.xz = stream, xz
        self.rows: list[tuple[ScoreResult, float | None]] = []

    def add(self, name: str, r: ScoreResult, xz_bits: float | None = None) -> None:
        if not self.rows:  # no header for a run whose only file failed
            xz_header = f" {'xz -9e':>10} {'vs xz':>7}" if self.xz else ""
            self._write(f"{'tokens':>10} {'bytes':>10} {'perplexity':>12} {'bits/byte':>10}{xz_header}  file")
        self.rows.append((r, xz_bits))
        self._row(r.tokens, r.bytes, r.perplexity, r.bits_per_byte, xz_bits, name)

    def complete(self) -> None:
        """Every file is in: the total, for several."""
        if len(self.rows) < 2:
            return
        tokens = sum(r.tokens for r, _ in self.rows)
        size = sum(r.bytes for r, _ in self.rows)
        logprob = sum(r.logprob for r, _ in self.rows)
        perplexity = math.exp(-logprob / tokens) if tokens else float("nan")
        bpb = -logprob / math.log(2) / size if size else float("nan")
        xz_total = None
        if self.xz and size:  # each file compressed on its own, as they were scored
            xz_total = sum((x or 0.0) * r.bytes for r, x in self.rows) / size
        self._row(tokens, size, perplexity, bpb, xz_total, "total")

    def _row(
        self, tokens: int, size: int, perplexity: float, bpb: float, xz_bpb: float | None, name: str
    ) -> None:
        xz_cells = ""
        if self.xz:
            versus = f"{100 * (bpb / xz_bpb - 1):+.0f}%" if xz_bpb else "–"
            xz_cells = f" {xz_bpb if xz_bpb is not None else float('nan'):>10.4f} {versus:>7}"
        self._write(f"{tokens:>10} {size:>10} {perplexity:>12.4f} {bpb:>10.4f}{xz_cells}  {name}")

    def close(self) -> None:
        pass

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


class JsonList:
    """A JSON list written one object at a time, and closed whatever happens: valid JSON even after a failure."""

    def __init__(self, stream: TextIO, *, xz: bool = False) -> None:
        self.stream, self.count, self.xz = stream, 0, xz
        self.stream.write("[")

    def add(self, name: str, result: ScoreResult, xz_bits: float | None = None) -> None:
        fields = {"file": name, **_score_fields(result)}
        if self.xz:
            fields["xz_bits_per_byte"] = xz_bits
        item = textwrap.indent(json.dumps(fields, indent=2), "  ")
        self.stream.write(("," if self.count else "") + "\n" + item)
        self.stream.flush()
        self.count += 1

    def complete(self) -> None:
        pass

    def close(self) -> None:
        self.stream.write("\n]\n" if self.count else "]\n")
        self.stream.flush()


def xz_bits(text: str) -> float:
    """Bits per byte of `text` (UTF-8) compressed as `xz -9e` does (LZMA2, preset 9 extreme, the .xz container):
    the reference the model's bits per byte is compared with (docs/default-model.md)."""
    data = text.encode("utf-8")
    compressed = lzma.compress(data, format=lzma.FORMAT_XZ, preset=9 | lzma.PRESET_EXTREME)
    return 8 * len(compressed) / len(data) if data else float("nan")


def _score_fields(result: ScoreResult) -> dict[str, Any]:
    keys = ("tokens", "bytes", "logprob", "nll", "perplexity", "bits_per_byte")
    return {k: getattr(result, k) for k in keys}
