"""Commands that talk to a server: generate, score, sessions."""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from ..errors import TxlError
from ..types import ScoreResult, Session
from . import EXIT_FAILED, UsageError, add_sampling, error_line, make_client, sampling_kwargs

# ---------------------------------------------------------------------------------------------- generate


def add_generate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", nargs="?", default="", help='text to continue ("-": read standard input)')
    parser.add_argument("--session", metavar="ID", help="continue this session (default: a new one)")
    parser.add_argument("--rm", action="store_true", help="delete the new session afterwards")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (no streamed text)")
    add_progress(parser, "how far the server is in reading a long prompt")
    add_sampling(parser, max_tokens=300)


def add_progress(parser: argparse.ArgumentParser, what: str) -> None:
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        action="store_true",
        default=None,
        help=f"always show {what} on stderr (default: on a terminal)",
    )
    progress.add_argument("--no-progress", dest="progress", action="store_false", help=f"never show {what}")


def generate(args: argparse.Namespace) -> int:
    """Always streams, also for --json: a long prompt then reports its progress, which keeps the request from
    timing out while the server is busy reading it."""
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt and not args.session:
        raise UsageError("give a prompt, or --session ID to continue a session")
    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
    with make_client(args) as client:
        session_id = args.session or client.create_session().id
        bar = ProgressBar("prompt", sys.stderr) if show_progress else None
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
        (str(path), _read_document(path)) for path in args.files
    ]  # every file readable before any work
    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
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


def _read_document(path: Path) -> str:
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start})") from exc
    if not text:
        raise UsageError(f"{path} is empty")
    return text


def _score_fields(result: ScoreResult) -> dict[str, Any]:
    keys = ("tokens", "bytes", "logprob", "nll", "perplexity", "bits_per_byte")
    return {k: getattr(result, k) for k in keys}


class ProgressBar:
    """One line on a terminal, redrawn at most 10 times a second: `name [#####-----] 50% 1200/2400 tokens`."""

    WIDTH = 30

    def __init__(self, name: str, stream: TextIO) -> None:
        self.name, self.stream = name, stream
        self.last = 0.0
        self.drawn = False

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        filled = self.WIDTH * done // total if total else self.WIDTH
        percent = 100 * done // total if total else 100
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r{self.name} [{bar}] {percent:3d}% {done}/{total} tokens")
        self.stream.flush()
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K" if self.stream.isatty() else "\n")
            self.stream.flush()


# ---------------------------------------------------------------------------------------------- sessions


def sessions_help(args: argparse.Namespace) -> int:
    raise UsageError(
        "give an action: txl sessions ls | show ID | rm ID... | new | history ID | rewind ID N | fork ID"
    )


def sessions_ls(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        sessions = client.list_sessions()
    if args.json:
        print(json.dumps([s.model_dump() for s in sessions], indent=2))
        return 0
    if not sessions:
        print("no sessions", file=sys.stderr)
        return 0
    width = max(len(s.id) for s in sessions)
    print(f"{'id':<{width}} {'tokens':>8} {'memory':>11} {'version':>7}  expires")
    for s in sorted(sessions, key=lambda s: s.created_at):
        memory = f"{s.mem_tokens}/{s.mem_len}"
        print(f"{s.id:<{width}} {s.tokens:>8} {memory:>11} {s.version:>7}  {_when(s.expires_at)}")
    return 0


def sessions_show(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        print(client.get_session(args.session_id).model_dump_json(indent=2))
    return 0


def sessions_rm(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        for session_id in args.session_ids:
            client.delete_session(session_id)
            print(f"deleted {session_id}")
    return 0


def describe(session: Session) -> str:
    return (
        f"session {session.id}: {session.tokens} tokens, memory {session.mem_tokens}/{session.mem_len}, "
        f"version {session.version}, model {session.model}, expires {_when(session.expires_at)}"
        + (f", metadata {json.dumps(session.metadata)}" if session.metadata else "")
    )


def _when(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
