"""The actions every kind of object has on the command line: `ls`, `show ID` and `rm ID...`."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Run = Callable[[argparse.Namespace], int]


def add_ls_show_rm(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    connection: argparse.ArgumentParser,
    *,
    noun: str,
    plural: str,
    runs: tuple[Run, Run, Run],
    rm_help: str,
) -> None:
    """`ls` (with --json), `show ID` (as JSON) and `rm ID...` of `noun`s, run by `runs` in that order; the ids
    land in `<noun>_id` and `<noun>_ids`."""
    helps = {"ls": f"list {plural}", "show": f"show one {noun} as JSON", "rm": rm_help}
    ls, show, rm = (actions.add_parser(name, help=text, parents=[connection]) for name, text in helps.items())
    ls.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument(f"{noun}_id", metavar="ID", help=f"the {noun}'s id (`ls` lists them)")
    rm.add_argument(f"{noun}_ids", metavar="ID", nargs="+", help=f"the ids of the {plural} to delete")
    for parser, run in zip((ls, show, rm), runs, strict=True):
        parser.set_defaults(run=run)
