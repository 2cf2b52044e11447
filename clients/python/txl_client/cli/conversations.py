"""Commands for conversations: `txl conversations new [--item TEXT...] | show ID | items ID | say ID TEXT |
rm ID...`. A conversation is a session and its items; `say` replies in it, feeding only its new text."""

from __future__ import annotations

import argparse
import json

from .connection import make_client
from .exits import UsageError


def add_conversations(parser: argparse.ArgumentParser, connection: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(title="actions", metavar="ACTION")
    new = actions.add_parser("new", help="start a conversation; prints its id", parents=[connection])
    new.add_argument(
        "--item",
        action="append",
        default=[],
        metavar="TEXT",
        help="a user message it starts with (repeatable)",
    )
    new.set_defaults(run=conversations_new)
    show = actions.add_parser("show", help="a conversation, as JSON", parents=[connection])
    show.add_argument("conversation_id", metavar="ID", help="the conversation's id (conv_...)")
    show.set_defaults(run=conversations_show)
    items = actions.add_parser("items", help="a conversation's items, oldest first", parents=[connection])
    items.add_argument("conversation_id", metavar="ID", help="the conversation's id (conv_...)")
    items.add_argument("--json", action="store_true", help="print the items as JSON")
    items.set_defaults(run=conversations_items)
    say = actions.add_parser(
        "say", help="reply in a conversation to TEXT; prints the reply", parents=[connection]
    )
    say.add_argument("conversation_id", metavar="ID", help="the conversation's id (conv_...)")
    say.add_argument("text", metavar="TEXT", help="the user's message (continued verbatim without --message)")
    say.add_argument(
        "--message", action="store_true", help="send TEXT as a user message (needs a chat template)"
    )
    say.add_argument("--max-tokens", type=int, default=None, help="at most this many tokens in the reply")
    say.add_argument(
        "--temperature", type=float, default=None, help="0: greedy (default: the server's, 1.0, as OpenAI's)"
    )
    say.add_argument("--json", action="store_true", help="print the response as JSON")
    say.set_defaults(run=conversations_say)
    rm = actions.add_parser("rm", help="delete conversations (and their sessions)", parents=[connection])
    rm.add_argument(
        "conversation_ids", nargs="+", metavar="ID", help="the ids of the conversations to delete"
    )
    rm.set_defaults(run=conversations_rm)


def conversations_help(args: argparse.Namespace) -> int:
    raise UsageError("give an action: txl conversations new | show ID | items ID | say ID TEXT | rm ID...")


def conversations_new(args: argparse.Namespace) -> int:
    items = [{"role": "user", "content": text} for text in args.item]
    with make_client(args) as client:
        conversation = client.conversations.create(items or None)
    print(conversation.id)
    return 0


def conversations_show(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        print(client.conversations.get(args.conversation_id).model_dump_json(indent=2))
    return 0


def conversations_items(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        items = client.conversations.items(args.conversation_id)
    if args.json:
        print(json.dumps([item.model_dump() for item in items], indent=2))
    else:
        for item in items:
            print(f"{item.role}: {item.text}")
    return 0


def conversations_say(args: argparse.Namespace) -> int:
    given = [{"role": "user", "content": args.text}] if args.message else args.text
    with make_client(args) as client:
        reply = client.conversations.reply(
            args.conversation_id, given, max_output_tokens=args.max_tokens, temperature=args.temperature
        )
    print(reply.model_dump_json(indent=2) if args.json else reply.text)
    return 0


def conversations_rm(args: argparse.Namespace) -> int:
    with make_client(args) as client:
        for conversation_id in args.conversation_ids:
            client.conversations.delete(conversation_id)
            print(f"deleted {conversation_id}")
    return 0
