"""`txl chat`: an interactive loop on one session.

Each line you type is added to the session (lines are separated by newlines) and a continuation is generated and
streamed. An empty line just continues. Commands: /fork (switch to a fork of the session), /reset (a new, empty
session), /info (the session's details), /help, /quit. Ctrl-C stops a generation (nothing is committed).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from ..client import Client
from ..errors import TxlError
from ..types import Session
from .connection import make_client
from .output import describe
from .sampling import add_sampling, sampling_kwargs
from .waiting import Waiting

HELP = "commands: /fork (switch to a fork)  /reset (new session)  /info (session details)  /help  /quit"


def add_chat(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--session", metavar="ID", help="chat on this session (default: a new one)")
    add_sampling(parser, max_tokens=300)


def chat(args: argparse.Namespace) -> int:
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # not on every platform
            import readline  # noqa: F401 - gives input() line editing and history
    with make_client(args) as client:
        loop = ChatLoop(client, args)
        session = client.get_session(args.session) if args.session else client.create_session()
        loop.switch(session)
        print(f"txl chat on session {session.id} (model {session.model}). {HELP}")
        return loop.run()


class ChatLoop:
    def __init__(self, client: Client, args: argparse.Namespace) -> None:
        self.client, self.args = client, args
        self.session: Session | None = None
        self.ends_line = (
            True  # whether the session's text ends with a newline (so the next line starts fresh)
        )

    def switch(self, session: Session) -> None:
        self.session = session
        self.ends_line = session.tokens == 0

    def run(self) -> int:
        while True:
            try:
                line = input("> ")
            except EOFError:
                print()
                return 0
            command = line.strip()
            try:
                if command.startswith("/"):
                    if not self.command(command):
                        return 0
                    continue
                self.step(line)
            except TxlError as exc:  # say what went wrong and keep the loop: the session is unchanged
                print(f"error: {exc}", file=sys.stderr)

    def command(self, command: str) -> bool:
        """Runs a /command; False to leave."""
        assert self.session is not None
        name = command.split()[0].lower()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/fork":
            fork = self.client.fork_session(self.session.id)
            print(f"forked {self.session.id} -> {fork.id}; now on {fork.id}")
            ends_line = self.ends_line
            self.switch(fork)
            self.ends_line = ends_line
        elif name == "/reset":
            self.switch(self.client.create_session())
            assert self.session is not None
            print(f"new session {self.session.id}")
        elif name == "/info":
            self.session = self.client.get_session(self.session.id)
            print(describe(self.session))
        elif name == "/help":
            print(HELP)
        else:
            print(f"unknown command {name}; {HELP}")
        return True

    def step(self, line: str) -> None:
        assert self.session is not None
        text = "" if not line else ("" if self.ends_line else "\n") + line + "\n"
        # On a terminal, until the server sends anything: how long, and what else it runs.
        waiting = Waiting(self.client, sys.stderr).start() if sys.stderr.isatty() else None
        try:
            stream = self.client.generate(
                self.session.id,
                text,
                stream=True,
                on_progress=(lambda *_: waiting.stop()) if waiting is not None else None,
                **sampling_kwargs(self.args),
            )
            with stream:
                for token in stream:
                    if waiting is not None:
                        waiting.stop()
                    sys.stdout.write(token.text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            print("\n[stopped: nothing was added to the session]")
            return
        finally:
            if waiting is not None:
                waiting.stop()
        result = stream.finish()
        self.session = result.session
        self.ends_line = result.text.endswith("\n") or (not result.text and text.endswith("\n"))
        if not result.text.endswith("\n"):
            print()
